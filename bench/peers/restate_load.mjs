// Restate side's load generator for bench/side_by_side.py: a light Node.js keep-alive HTTP client on Restate's
// ingress. One JSON argument: {mode, ingress, k, ...}; prints one JSON line per event to stdout.
//   latency:    {warmup, turns}           -> {"latencies_ms": [...]} (sequential turns, a fresh workflow id each)
//   throughput: {inflight, warmup_s, window_s} -> {"event": "window-start"} ... {"event": "window-end", "turns": n}
//   one:        {id, body}                -> {"event": "done", "result": ...} when the workflow's result was read
import http from "node:http";
import { randomUUID } from "node:crypto";

const cfg = JSON.parse(process.argv[2]);
const url = new URL(cfg.ingress);
const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });

function call(id, body) {
  return new Promise((resolve, reject) => {
    const payload = JSON.stringify(body);
    const req = http.request(
      {
        host: url.hostname, port: url.port, method: "POST", path: `/Turn/${id}/run`, agent,
        headers: { "content-type": "application/json", "content-length": Buffer.byteLength(payload) },
      },
      (res) => {
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString();
          if (res.statusCode !== 200) reject(new Error(`HTTP ${res.statusCode} for ${id}: ${text}`));
          else resolve(JSON.parse(text));
        });
      },
    );
    req.on("error", reject);
    req.end(payload);
  });
}

function emit(obj) { process.stdout.write(JSON.stringify(obj) + "\n"); }

async function latency() {
  for (let i = 0; i < cfg.warmup; i++) await call(randomUUID(), { k: cfg.k });
  const out = [];
  for (let i = 0; i < cfg.turns; i++) {
    const t0 = process.hrtime.bigint();
    const result = await call(randomUUID(), { k: cfg.k });
    out.push(Number(process.hrtime.bigint() - t0) / 1e6);
    if (result !== "hello") throw new Error(`unexpected result ${JSON.stringify(result)}`);
  }
  emit({ latencies_ms: out });
}

async function throughput() {
  let counting = false, stop = false, turns = 0;
  async function loop() {
    while (!stop) {
      const result = await call(randomUUID(), { k: cfg.k });
      if (result !== "hello") throw new Error(`unexpected result ${JSON.stringify(result)}`);
      if (counting && !stop) turns++;
    }
  }
  const loops = Array.from({ length: cfg.inflight }, loop);
  await new Promise((r) => setTimeout(r, cfg.warmup_s * 1000));
  counting = true;
  emit({ event: "window-start" });
  await new Promise((r) => setTimeout(r, cfg.window_s * 1000));
  stop = true;
  const counted = turns;
  emit({ event: "window-end", turns: counted });
  await Promise.all(loops);
}

async function one() {
  const result = await call(cfg.id, cfg.body);
  emit({ event: "done", result });
}

const modes = { latency, throughput, one };
modes[cfg.mode]().then(() => { agent.destroy(); }, (err) => {
  process.stderr.write(`restate_load: ${err.stack || err}\n`);
  process.exit(1);
});
