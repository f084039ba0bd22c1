package tidegate.compat;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.debezium.embedded.Connect;
import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import io.debezium.engine.format.Json;
import io.debezium.transforms.ExtractNewRecordState;
import java.io.BufferedWriter;
import java.io.FileInputStream;
import java.io.InputStreamReader;
import java.io.IOException;
import java.io.Reader;
import java.io.Writer;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.connect.data.SchemaAndValue;
import org.apache.kafka.connect.header.ConnectHeaders;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.storage.SimpleHeaderConverter;

/**
 * Debezium's own connectors and transform, as a tidegate test tool (docs/compat.md).
 *
 * <pre>
 * capture --properties FILE --out DIR --stop-table T [--probe-table P] [--timeout-seconds N]
 *     Runs Debezium's embedded engine with the connector settings in FILE (kept out of argv:
 *     they hold a password) until the first record of table T (prefix.db.table) has been
 *     written, and writes every record to DIR/records.schemas-off.jsonl and
 *     DIR/records.schemas-on.jsonl. Records of table P are not written: the caller inserts
 *     them until "CAPTURING" is printed, which says the connector reads the log.
 * count --properties FILE --table T --rows N [--timeout-seconds N]
 *     Debezium's snapshot speed (benchmarks/snapshot.py): runs the embedded engine the way it
 *     runs for throughput (JSON format, a batch consumer, engine defaults) with the connector
 *     settings in FILE until N records of table T (prefix.db.table) have been handed over. Each
 *     record's value (Debezium's JSON, as the JsonConverter writes it) is taken and its bytes
 *     counted; nothing is kept or written. Prints one line "COUNTED {json}" with the counts and
 *     the clock: JVM start, engine start, first and N-th record, and the process's CPU time
 *     and peak RSS at those moments.
 * extract --in FILE --out-prefix PREFIX
 *     Reads records written with schemas on (by capture, or tidegate's read back from Kafka;
 *     headers from their "text"), applies io.debezium.transforms.ExtractNewRecordState with its default settings and
 *     writes PREFIX.schemas-off.jsonl and PREFIX.schemas-on.jsonl.
 * </pre>
 *
 * One JSON line per record: {"topic", "key", "value", "headers": [{"key", "json", "text"}]},
 * key and value as the Kafka Connect JsonConverter writes them; a header as the JsonConverter
 * writes it ("json") and as Kafka Connect's default header converter does ("text").
 */
public final class DebeziumCapture {
    private static final ObjectMapper JSON = new ObjectMapper();

    private DebeziumCapture() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length == 0) {
            usage("a command: capture or extract");
        }
        Map<String, String> options = options(args);
        switch (args[0]) {
            case "capture" -> System.exit(capture(options));
            case "count" -> System.exit(count(options));
            case "extract" -> System.exit(extract(options));
            default -> usage("unknown command " + args[0]);
        }
    }

    private static void usage(String problem) {
        System.err.println("debezium-capture: " + problem + "\n"
                + "usage: capture --properties FILE --out DIR --stop-table T [--probe-table P]"
                + " [--timeout-seconds N]\n"
                + "       count --properties FILE --table T --rows N [--timeout-seconds N]\n"
                + "       extract --in FILE --out-prefix PREFIX");
        System.exit(64);
    }

    private static Map<String, String> options(String[] args) {
        Map<String, String> options = new HashMap<>();
        for (int i = 1; i < args.length; i += 2) {
            if (!args[i].startsWith("--") || i + 1 >= args.length) {
                usage("options come as --name value pairs, got " + args[i]);
            }
            options.put(args[i].substring(2), args[i + 1]);
        }
        return options;
    }

    private static String required(Map<String, String> options, String name) {
        String value = options.get(name);
        if (value == null) {
            usage("--" + name + " is required");
        }
        return value;
    }

    /** Both forms a Kafka Connect worker with the JsonConverter gives a record. */
    static final class RecordWriter implements AutoCloseable {
        private final Writer schemasOff;
        private final Writer schemasOn;
        private final JsonConverter keysOff = converter(false, true);
        private final JsonConverter valuesOff = converter(false, false);
        private final JsonConverter keysOn = converter(true, true);
        private final JsonConverter valuesOn = converter(true, false);
        private final SimpleHeaderConverter headerText = new SimpleHeaderConverter();

        RecordWriter(String prefix) throws IOException {
            schemasOff = Files.newBufferedWriter(Path.of(prefix + ".schemas-off.jsonl"), StandardCharsets.UTF_8);
            schemasOn = Files.newBufferedWriter(Path.of(prefix + ".schemas-on.jsonl"), StandardCharsets.UTF_8);
            headerText.configure(Map.of());
        }

        void write(SourceRecord record) throws IOException {
            schemasOff.write(line(record, keysOff, valuesOff));
            schemasOn.write(line(record, keysOn, valuesOn));
        }

        private String line(SourceRecord record, JsonConverter keys, JsonConverter values) throws IOException {
            String topic = record.topic();
            ObjectNode line = JSON.createObjectNode();
            line.put("topic", topic);
            line.set("key", tree(keys.fromConnectData(topic, record.keySchema(), record.key())));
            line.set("value", tree(values.fromConnectData(topic, record.valueSchema(), record.value())));
            ArrayNode headers = line.putArray("headers");
            for (Header header : record.headers()) {
                ObjectNode entry = headers.addObject();
                entry.put("key", header.key());
                entry.set("json", headerJson(values, topic, header));
                byte[] text = headerText.fromConnectHeader(topic, header.key(), header.schema(), header.value());
                entry.put("text", text == null ? null : new String(text, StandardCharsets.UTF_8));
            }
            return JSON.writeValueAsString(line) + "\n";
        }

        @Override
        public void close() throws IOException {
            schemasOff.close();
            schemasOn.close();
        }
    }

    /** A header as the JsonConverter writes it; null when its schema does not fit its value (a
     *  header read back from text is typed by a guess, and only "text" is compared). */
    private static JsonNode headerJson(JsonConverter values, String topic, Header header) throws IOException {
        try {
            return tree(values.fromConnectHeader(topic, header.key(), header.schema(), header.value()));
        } catch (org.apache.kafka.connect.errors.DataException unfit) {
            return null;
        }
    }

    private static JsonConverter converter(boolean schemas, boolean isKey) {
        JsonConverter converter = new JsonConverter();
        converter.configure(Map.of("schemas.enable", String.valueOf(schemas)), isKey);
        return converter;
    }

    private static JsonNode tree(byte[] bytes) throws IOException {
        return bytes == null ? null : JSON.readTree(bytes);
    }

    private static byte[] bytes(JsonNode node) throws IOException {
        return node == null || node.isNull() ? null : JSON.writeValueAsBytes(node);
    }

    private static Properties properties(Map<String, String> options) throws IOException {
        Properties props = new Properties();
        try (Reader in = new InputStreamReader(new FileInputStream(required(options, "properties")),
                StandardCharsets.UTF_8)) {
            props.load(in);
        }
        return props;
    }

    /** CPU seconds of this JVM (every thread, GC included). */
    private static double cpuSeconds() {
        return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
                .getProcessCpuTime() / 1e9;
    }

    /** Peak resident set size of this process in MB (VmHWM), or -1 where /proc is missing. */
    private static double peakRssMb() {
        try {
            for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
                if (line.startsWith("VmHWM:")) {
                    return Long.parseLong(line.replaceAll("[^0-9]", "")) / 1024.0;
                }
            }
        } catch (IOException | NumberFormatException missing) {
            // not Linux: reported as -1
        }
        return -1;
    }

    /** Counts the records of one table and the bytes of their values; marks the first and the
     *  N-th with the clock and this process's CPU time. */
    static final class Counter implements DebeziumEngine.ChangeConsumer<ChangeEvent<String, String>> {
        final String topic;
        final long rows;
        final CountDownLatch reached = new CountDownLatch(1);
        volatile long count;
        long bytes;
        long others;
        long batches;
        long firstNanos;
        long lastNanos;
        double firstCpu;
        double lastCpu;
        String lastSnapshotMark;

        Counter(String topic, long rows) {
            this.topic = topic;
            this.rows = rows;
        }

        @Override
        public void handleBatch(List<ChangeEvent<String, String>> records,
                                DebeziumEngine.RecordCommitter<ChangeEvent<String, String>> committer)
                throws InterruptedException {
            batches++;
            for (ChangeEvent<String, String> record : records) {
                String value = record.value();
                if (value != null && topic.equals(record.destination()) && count < rows) {
                    if (count == 0) {
                        firstNanos = System.nanoTime();
                        firstCpu = cpuSeconds();
                    }
                    bytes += value.getBytes(StandardCharsets.UTF_8).length;
                    count++;
                    if (count == rows) {
                        lastNanos = System.nanoTime();
                        lastCpu = cpuSeconds();
                        int at = value.indexOf("\"snapshot\":\"");
                        lastSnapshotMark = at < 0 ? null
                                : value.substring(at + 12, value.indexOf('"', at + 12));
                        reached.countDown();
                    }
                } else {
                    others++;
                }
                committer.markProcessed(record);
            }
            committer.markBatchFinished();
        }
    }

    private static int count(Map<String, String> options) throws Exception {
        long jvmStartMs = ManagementFactory.getRuntimeMXBean().getStartTime();
        Properties props = properties(options);
        String topic = props.getProperty("topic.prefix") + "." + required(options, "table");
        long rows = Long.parseLong(required(options, "rows"));
        long timeout = Long.parseLong(options.getOrDefault("timeout-seconds", "1800"));
        Counter counter = new Counter(topic, rows);
        AtomicReference<Throwable> failure = new AtomicReference<>();
        CountDownLatch stopped = new CountDownLatch(1);
        long engineStartMs = System.currentTimeMillis();
        long engineStartNanos = System.nanoTime();
        double engineStartCpu = cpuSeconds();
        DebeziumEngine<ChangeEvent<String, String>> engine = DebeziumEngine.create(Json.class)
                .using(props)
                .using((success, message, error) -> {
                    if (!success) {
                        failure.compareAndSet(null, error != null ? error : new IllegalStateException(message));
                    }
                    stopped.countDown();
                })
                .notifying(counter)
                .build();
        ExecutorService executor = Executors.newSingleThreadExecutor();
        executor.execute(engine);
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(timeout);
        boolean reached = false;
        while (!reached && stopped.getCount() > 0 && System.nanoTime() < deadline) {
            reached = counter.reached.await(200, TimeUnit.MILLISECONDS);
        }
        double peakAtLast = peakRssMb();
        if (!stopEngine(engine, executor, failure)) {
            return 1;
        }
        if (!reached) {
            System.err.println("debezium-capture: " + counter.count + " of " + rows + " records of " + topic
                    + " within " + timeout + " s");
            return 2;
        }
        ObjectNode out = JSON.createObjectNode();
        out.put("rows", counter.count);
        out.put("bytes", counter.bytes);
        out.put("other_records", counter.others);
        out.put("batches", counter.batches);
        out.put("last_snapshot_mark", counter.lastSnapshotMark);
        out.put("jvm_start_s", (engineStartMs - jvmStartMs) / 1e3);
        out.put("connector_start_s", (counter.firstNanos - engineStartNanos) / 1e9);
        out.put("snapshot_s", (counter.lastNanos - counter.firstNanos) / 1e9);
        out.put("snapshot_cpu_s", counter.lastCpu - counter.firstCpu);
        out.put("start_cpu_s", counter.firstCpu);
        out.put("engine_start_cpu_s", engineStartCpu);
        out.put("peak_rss_mb", Math.max(peakAtLast, peakRssMb()));
        out.put("max_heap_mb", Runtime.getRuntime().maxMemory() / 1048576.0);
        System.out.println("COUNTED " + JSON.writeValueAsString(out));
        System.out.flush();
        return 0;
    }

    private static int capture(Map<String, String> options) throws Exception {
        Properties props = properties(options);
        Path out = Path.of(required(options, "out"));
        Files.createDirectories(out);
        String prefix = props.getProperty("topic.prefix");
        String stopTopic = prefix + "." + required(options, "stop-table");
        String probeTopic = options.containsKey("probe-table") ? prefix + "." + options.get("probe-table") : null;
        long timeout = Long.parseLong(options.getOrDefault("timeout-seconds", "120"));

        CountDownLatch stopped = new CountDownLatch(1);
        AtomicReference<Throwable> failure = new AtomicReference<>();
        long[] written = {0};
        boolean[] announced = {false};
        try (RecordWriter writer = new RecordWriter(out.resolve("records").toString())) {
            DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine
                    .create(ChangeEventFormat.of(Connect.class))
                    .using(props)
                    .using((success, message, error) -> {
                        if (!success) {
                            failure.compareAndSet(null, error != null ? error : new IllegalStateException(message));
                            stopped.countDown();
                        }
                    })
                    .notifying(event -> {
                        if (stopped.getCount() == 0) {
                            return; // records after the stop table's are not part of the backlog
                        }
                        SourceRecord record = event.record();
                        try {
                            if (record.topic().equals(probeTopic)) {
                                if (!announced[0]) {
                                    announced[0] = true;
                                    System.out.println("CAPTURING");
                                    System.out.flush();
                                }
                                return;
                            }
                            writer.write(record);
                            written[0]++;
                        } catch (IOException e) {
                            failure.compareAndSet(null, e);
                        }
                        if (record.topic().equals(stopTopic)) {
                            stopped.countDown();
                        }
                    })
                    .build();
            ExecutorService executor = Executors.newSingleThreadExecutor();
            executor.execute(engine);
            boolean reached = stopped.await(timeout, TimeUnit.SECONDS);
            if (!stopEngine(engine, executor, failure)) {
                return 1;
            }
            if (!reached) {
                System.err.println("debezium-capture: no record of " + stopTopic + " within " + timeout
                        + " s (" + written[0] + " records written): is the stop table in the connector's"
                        + " include lists, and was a row inserted into it after the backlog?");
                return 2;
            }
        }
        System.out.println("DONE " + written[0]);
        return 0;
    }

    private static int extract(Map<String, String> options) throws Exception {
        JsonConverter keysOn = converter(true, true);
        JsonConverter valuesOn = converter(true, false);
        SimpleHeaderConverter headerText = new SimpleHeaderConverter();
        headerText.configure(Map.of());
        List<SourceRecord> records = new ArrayList<>();
        for (String text : Files.readAllLines(Path.of(required(options, "in")), StandardCharsets.UTF_8)) {
            if (text.isBlank()) {
                continue;
            }
            JsonNode line = JSON.readTree(text);
            String topic = line.get("topic").asText();
            SchemaAndValue key = keysOn.toConnectData(topic, bytes(line.get("key")));
            SchemaAndValue value = valuesOn.toConnectData(topic, bytes(line.get("value")));
            ConnectHeaders headers = new ConnectHeaders();
            JsonNode given = line.get("headers");
            if (given != null) {
                for (JsonNode header : given) {
                    String name = header.get("key").asText();
                    JsonNode written = header.get("text");
                    byte[] raw = written == null || written.isNull() ? null
                            : written.asText().getBytes(StandardCharsets.UTF_8);
                    headers.add(name, headerText.toConnectHeader(topic, name, raw));
                }
            }
            records.add(new SourceRecord(null, null, topic, null, key.schema(), key.value(),
                    value.schema(), value.value(), null, headers));
        }
        int kept = 0;
        try (ExtractNewRecordState<SourceRecord> transform = new ExtractNewRecordState<>();
                RecordWriter writer = new RecordWriter(required(options, "out-prefix"))) {
            transform.configure(Map.of());
            for (SourceRecord record : records) {
                SourceRecord result = transform.apply(record);
                if (result != null) {
                    writer.write(result);
                    kept++;
                }
            }
        }
        System.out.println("EXTRACTED " + kept + " of " + records.size());
        return 0;
    }

    /** Closes the engine (one that stopped itself has failed: said below) and waits for its
     * thread; false, with the failure printed, when the engine failed. */
    private static boolean stopEngine(java.io.Closeable engine, ExecutorService executor,
                                      AtomicReference<Throwable> failure) throws IOException, InterruptedException {
        try {
            engine.close();
        } catch (IllegalStateException alreadyStopped) {
            // the engine stopped itself (it failed): the failure is reported below
        }
        executor.shutdown();
        executor.awaitTermination(30, TimeUnit.SECONDS);
        if (failure.get() != null) {
            System.err.println("debezium-capture: the engine failed: " + failure.get());
            failure.get().printStackTrace();
            return false;
        }
        return true;
    }
}
