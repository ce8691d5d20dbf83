// The Java Avro library as an oracle for settled's schemas and codec (issue 4; tests/integration/test_avro_java_oracle.py).
//
// Usage: java -cp <avro jars>:<classes> AvroOracle <avsc dir> <work dir>
//   <work dir>/order.txt        the .avsc file names in dependency order (parsed with one Schema.Parser)
//   <work dir>/standalone/*.avsc settled's standalone schemas, each parsed alone
//   <work dir>/<case>.name      a record's full name; <case>.json its Avro JSON encoding; <case>.py.bin settled's
//                               single-object encoding of it
// Writes:
//   fingerprints.tsv            full name <TAB> SchemaNormalization.parsingFingerprint64 (unsigned decimal), per shipped file
//   standalone.tsv              the same, per standalone schema
//   <case>.java.bin             BinaryMessageEncoder's single-object encoding of the record read from <case>.json
//   <case>.java.json            the record BinaryMessageDecoder read from <case>.py.bin, written as Avro JSON
import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;
import org.apache.avro.io.JsonEncoder;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;

public final class AvroOracle {
  private AvroOracle() {}

  private static String fingerprint(Schema schema) {
    return Long.toUnsignedString(SchemaNormalization.parsingFingerprint64(schema));
  }

  public static void main(String[] args) throws Exception {
    Path avsc = Paths.get(args[0]);
    Path work = Paths.get(args[1]);

    Schema.Parser parser = new Schema.Parser();
    Map<String, Schema> byName = new LinkedHashMap<>();
    List<String> order = Files.readAllLines(work.resolve("order.txt"));
    for (String file : order) {
      if (file.isBlank()) continue;
      Schema schema = parser.parse(avsc.resolve(file).toFile());
      byName.put(schema.getFullName(), schema);
    }
    StringBuilder fingerprints = new StringBuilder();
    for (Schema schema : byName.values()) {
      fingerprints.append(schema.getFullName()).append('\t').append(fingerprint(schema)).append('\n');
    }
    Files.writeString(work.resolve("fingerprints.tsv"), fingerprints);

    StringBuilder standalone = new StringBuilder();
    try (DirectoryStream<Path> files = Files.newDirectoryStream(work.resolve("standalone"), "*.avsc")) {
      for (Path file : files) {
        Schema schema = new Schema.Parser().parse(file.toFile());
        standalone.append(schema.getFullName()).append('\t').append(fingerprint(schema)).append('\n');
      }
    }
    Files.writeString(work.resolve("standalone.tsv"), standalone);

    GenericData model = GenericData.get();
    try (DirectoryStream<Path> cases = Files.newDirectoryStream(work, "*.name")) {
      for (Path nameFile : cases) {
        String base = nameFile.getFileName().toString().replaceAll("\\.name$", "");
        Schema schema = byName.get(Files.readString(nameFile).trim());
        if (schema == null) throw new IllegalArgumentException("unknown record " + Files.readString(nameFile));

        GenericDatumReader<Object> jsonReader = new GenericDatumReader<>(schema, schema, model);
        Object datum = jsonReader.read(null,
            DecoderFactory.get().jsonDecoder(schema, Files.readString(work.resolve(base + ".json"))));
        ByteBuffer encoded = new BinaryMessageEncoder<Object>(model, schema).encode(datum);
        byte[] bytes = new byte[encoded.remaining()];
        encoded.get(bytes);
        Files.write(work.resolve(base + ".java.bin"), bytes);

        Object fromPython = new BinaryMessageDecoder<Object>(model, schema)
            .decode(Files.readAllBytes(work.resolve(base + ".py.bin")));
        ByteArrayOutputStream json = new ByteArrayOutputStream();
        JsonEncoder encoder = EncoderFactory.get().jsonEncoder(schema, json);
        new GenericDatumWriter<Object>(schema, model).write(fromPython, encoder);
        encoder.flush();
        Files.write(work.resolve(base + ".java.json"), json.toByteArray());
      }
    }
  }
}
