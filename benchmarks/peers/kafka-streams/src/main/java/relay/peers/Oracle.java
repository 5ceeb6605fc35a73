package relay.peers;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.function.BiFunction;
import java.util.stream.Stream;
import org.apache.kafka.common.serialization.LongDeserializer;
import org.apache.kafka.common.serialization.LongSerializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TestInputTopic;
import org.apache.kafka.streams.TestOutputTopic;
import org.apache.kafka.streams.TopologyTestDriver;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.KGroupedTable;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindowedDeserializer;
import org.apache.kafka.streams.kstream.SessionWindowedKStream;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.SlidingWindows;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindowedDeserializer;
import org.apache.kafka.streams.kstream.TimeWindowedKStream;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.kstream.WindowedSerdes;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.SessionStore;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.WindowStore;
import org.apache.kafka.streams.test.TestRecord;

/**
 * The differential oracle: runs a topology described in JSON on Kafka Streams'
 * TopologyTestDriver, with caching off, and answers every record it wrote.
 *
 * <p>One request per line on stdin, one answer per line on stdout:
 * <pre>
 * {"topology": {"steps": [...]}, "records": [{"topic", "key", "value", "timestamp"}]}
 * {"outputs": {"topic": [[key, value, timestamp], ...]}}   or   {"error": "..."}
 * </pre>
 * Keys and values are longs or null; a windowed key is answered as [key, start, end]. Each
 * step reads the step before it, or the step named by its index in "from". The functions are
 * a fixed vocabulary that Relay's side interprets the same way (tests/differential/vocabulary.py).
 */
public final class Oracle {
    private static final ObjectMapper JSON = new ObjectMapper();

    /**
     * What a step produced: a stream, a table, a grouped or windowed stream; with the window
     * size (and grace) when its keys are windowed, and the kind of its windows ("time",
     * "sliding" or "session"; keys of sliding windows are time-windowed keys).
     */
    private record Built(Object value, Long windowSize, long grace, String windows) {
        Built(Object value, Long windowSize) {
            this(value, windowSize, 0, windowSize == null ? null : "time");
        }

        /** What ``value`` produced, with the windows of ``from``. */
        static Built like(Object value, Built from) {
            return new Built(value, from == null ? null : from.windowSize(), from == null ? 0 : from.grace(),
                    from == null ? null : from.windows());
        }
    }

    /** An output topic and how to read its keys: windowSize null for plain keys. */
    private record Sink(String topic, Long windowSize, String windows) {}

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            ObjectNode answer = JSON.createObjectNode();
            try {
                answer.set("outputs", run(JSON.readTree(line)));
            } catch (Exception e) {
                Throwable root = e;
                while (root.getCause() != null) {
                    root = root.getCause();
                }
                answer.put("error", e + (root != e ? " (caused by " + root + ")" : ""));
            }
            out.println(JSON.writeValueAsString(answer));
            out.flush();
        }
    }

    static final Path STATE_DIR = ownStateDir();

    static Path ownStateDir() {
        try {
            Path dir = Files.createTempDirectory("relay-oracle-");
            Runtime.getRuntime().addShutdownHook(new Thread(() -> {
                try (Stream<Path> paths = Files.walk(dir)) {
                    paths.sorted(Comparator.reverseOrder()).forEach(path -> path.toFile().delete());
                } catch (IOException ignored) {
                    // a temporary directory: the system cleans it eventually
                }
            }));
            return dir;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    static ObjectNode run(JsonNode request) {
        StreamsBuilder builder = new StreamsBuilder();
        List<Sink> sinks = new ArrayList<>();
        List<String> sources = new ArrayList<>();
        build(builder, request.get("topology").get("steps"), sinks, sources);
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, "oracle");
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, "127.0.0.1:1");
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        // A state directory of this JVM's own: another oracle running beside it (its default
        // is one fixed path) would hold the same stores' RocksDB locks.
        props.put(StreamsConfig.STATE_DIR_CONFIG, STATE_DIR.toString());
        // A left or outer stream-stream join looks for closed unmatched records at every record
        // that reaches its stream time, as Relay does; by default it throttles that to once a
        // second of wall-clock time, which the driver's clock never passes.
        props.put(StreamsConfig.InternalConfig.EMIT_INTERVAL_MS_KSTREAMS_OUTER_JOIN_SPURIOUS_RESULTS_FIX, 0L);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.LongSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.LongSerde.class);
        ObjectNode outputs = JSON.createObjectNode();
        try (TopologyTestDriver driver = new TopologyTestDriver(builder.build(), props)) {
            Map<String, TestInputTopic<Long, Long>> inputs = new HashMap<>();
            for (String topic : sources) {
                inputs.put(topic, driver.createInputTopic(topic, new LongSerializer(), new LongSerializer()));
            }
            for (JsonNode r : request.get("records")) {
                TestInputTopic<Long, Long> topic = inputs.get(r.get("topic").asText());
                if (topic == null) {
                    throw new IllegalArgumentException("the topology does not read " + r.get("topic"));
                }
                topic.pipeInput(new TestRecord<>(longOrNull(r.get("key")), longOrNull(r.get("value")),
                        null, r.get("timestamp").asLong()));
            }
            for (Sink sink : sinks) {
                outputs.set(sink.topic(), read(driver, sink));
            }
        }
        return outputs;
    }

    private static ArrayNode read(TopologyTestDriver driver, Sink sink) {
        ArrayNode records = JSON.createArrayNode();
        if ("session".equals(sink.windows())) {
            TestOutputTopic<Windowed<Long>, Long> topic = driver.createOutputTopic(sink.topic(),
                    new SessionWindowedDeserializer<>(new LongDeserializer()), new LongDeserializer());
            for (TestRecord<Windowed<Long>, Long> r : topic.readRecordsToList()) {
                addWindowed(records, r);
            }
        } else if (sink.windowSize() == null) {
            TestOutputTopic<Long, Long> topic =
                    driver.createOutputTopic(sink.topic(), new LongDeserializer(), new LongDeserializer());
            for (TestRecord<Long, Long> r : topic.readRecordsToList()) {
                ArrayNode record = records.addArray();
                addLong(record, r.key());
                addLong(record, r.value());
                record.add(r.timestamp());
            }
        } else {
            TimeWindowedDeserializer<Long> keys =
                    new TimeWindowedDeserializer<>(new LongDeserializer(), sink.windowSize());
            TestOutputTopic<Windowed<Long>, Long> topic =
                    driver.createOutputTopic(sink.topic(), keys, new LongDeserializer());
            for (TestRecord<Windowed<Long>, Long> r : topic.readRecordsToList()) {
                addWindowed(records, r);
            }
        }
        return records;
    }

    private static void addWindowed(ArrayNode records, TestRecord<Windowed<Long>, Long> r) {
        ArrayNode record = records.addArray();
        ArrayNode key = record.addArray();
        addLong(key, r.key().key());
        key.add(r.key().window().start());
        key.add(r.key().window().end());
        addLong(record, r.value());
        record.add(r.timestamp());
    }

    @SuppressWarnings("unchecked")
    private static void build(StreamsBuilder builder, JsonNode steps, List<Sink> sinks, List<String> sources) {
        Map<Integer, Built> built = new LinkedHashMap<>();
        for (int i = 0; i < steps.size(); i++) {
            JsonNode step = steps.get(i);
            String op = step.get("op").asText();
            Built from = built.get(step.has("from") ? step.get("from").asInt() : i - 1);
            Object up = from == null ? null : from.value();
            Long size = from == null ? null : from.windowSize();
            String windowKind = from == null ? null : from.windows();
            Built result;
            switch (op) {
                case "source" -> {
                    sources.add(step.get("topic").asText());
                    result = new Built(builder.stream(step.get("topic").asText(),
                            Consumed.with(Serdes.Long(), Serdes.Long())), null);
                }
                case "table" -> {
                    sources.add(step.get("topic").asText());
                    result = new Built(builder.table(step.get("topic").asText(),
                            Consumed.with(Serdes.Long(), Serdes.Long()),
                            Materialized.<Long, Long>as(Stores.inMemoryKeyValueStore("table-" + i))
                                    .withKeySerde(Serdes.Long()).withValueSerde(Serdes.Long())), null);
                }
                case "filter" -> {
                    long k = step.get("k").asLong();
                    long r = step.get("r").asLong();
                    result = Built.like(up instanceof KTable
                            ? ((KTable<Object, Long>) up).filter((key, v) -> v != null && Math.floorMod(v, k) == r)
                            : ((KStream<Object, Long>) up)
                                    .filter((key, v) -> v != null && Math.floorMod(v, k) == r), from);
                }
                case "map_values" -> {
                    long a = step.get("a").asLong();
                    long b = step.get("b").asLong();
                    result = Built.like(up instanceof KTable
                            ? ((KTable<Object, Long>) up).mapValues(v -> v == null ? null : a * v + b)
                            : ((KStream<Object, Long>) up).mapValues(v -> v == null ? null : a * v + b), from);
                }
                case "map" -> {
                    long k = step.get("k").asLong();
                    result = new Built(((KStream<Long, Long>) up).map((key, v) ->
                            KeyValue.pair(v == null ? null : Math.floorMod(v, k), key)), null);
                }
                case "select_key" -> {
                    long k = step.get("k").asLong();
                    result = new Built(((KStream<Long, Long>) up)
                            .selectKey((key, v) -> v == null ? null : Math.floorMod(v, k)), null);
                }
                case "flat_map" -> {
                    long n = step.get("n").asLong();
                    result = new Built(((KStream<Long, Long>) up).flatMap((key, v) -> {
                        List<KeyValue<Long, Long>> records = new ArrayList<>();
                        if (v == null) {
                            records.add(KeyValue.pair(key, null));
                        } else {
                            for (long j = 0; j < Math.floorMod(v, n); j++) {
                                records.add(KeyValue.pair(key == null ? null : key + j, v + j));
                            }
                        }
                        return records;
                    }), null);
                }
                case "group_by_key" -> result = new Built(((KStream<Long, Long>) up)
                        .groupByKey(Grouped.with(Serdes.Long(), Serdes.Long())), null);
                case "group_by" -> {
                    long k = step.get("k").asLong();
                    result = new Built(((KStream<Long, Long>) up).groupBy(
                            (key, v) -> v == null ? null : Math.floorMod(v, k),
                            Grouped.with(Serdes.Long(), Serdes.Long())), null);
                }
                case "windowed_by" -> {
                    long windowSize = step.get("size").asLong();
                    TimeWindows windows = TimeWindows.ofSizeAndGrace(Duration.ofMillis(windowSize),
                            Duration.ofMillis(step.get("grace").asLong()))
                            .advanceBy(Duration.ofMillis(step.get("advance").asLong()));
                    result = new Built(((KGroupedStream<Long, Long>) up).windowedBy(windows), windowSize,
                            step.get("grace").asLong(), "time");
                }
                case "session_windowed_by" -> {
                    long gap = step.get("gap").asLong();
                    long grace = step.get("grace").asLong();
                    result = new Built(((KGroupedStream<Long, Long>) up).windowedBy(
                            SessionWindows.ofInactivityGapAndGrace(Duration.ofMillis(gap), Duration.ofMillis(grace))),
                            gap, grace, "session");
                }
                case "sliding_windowed_by" -> {
                    long difference = step.get("difference").asLong();
                    long grace = step.get("grace").asLong();
                    result = new Built(((KGroupedStream<Long, Long>) up).windowedBy(
                            SlidingWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(difference),
                                    Duration.ofMillis(grace))), difference, grace, "sliding");
                }
                case "count", "reduce", "aggregate" ->
                        result = Built.like(aggregate(op, step, up, "store-" + i, from), from);
                case "to_stream" -> result = Built.like(((KTable<Object, Long>) up).toStream(), from);
                case "to_table" -> result = new Built(((KStream<Long, Long>) up).toTable(
                        Materialized.<Long, Long>as(Stores.inMemoryKeyValueStore("to-table-" + i))
                                .withKeySerde(Serdes.Long()).withValueSerde(Serdes.Long())), null);
                case "suppress" -> result = Built.like(((KTable<Windowed<Long>, Long>) up).suppress(
                        Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded())), from);
                case "table_join" -> {
                    KTable<Long, Long> other = (KTable<Long, Long>) built.get(step.get("other").asInt()).value();
                    KTable<Long, Long> table = (KTable<Long, Long>) up;
                    result = new Built(switch (step.get("kind").asText()) {
                        case "inner" -> table.join(other, Oracle::paired);
                        case "left" -> table.leftJoin(other, Oracle::paired);
                        default -> table.outerJoin(other, Oracle::paired);
                    }, null);
                }
                case "fk_join" -> {
                    KTable<Long, Long> other = (KTable<Long, Long>) built.get(step.get("other").asInt()).value();
                    KTable<Long, Long> table = (KTable<Long, Long>) up;
                    long k = step.get("k").asLong();
                    BiFunction<Long, Long, Long> foreignKey = (key, v) -> Math.floorMod(v, k);
                    result = new Built(step.get("kind").asText().equals("inner")
                            ? table.join(other, foreignKey, Oracle::paired)
                            : table.leftJoin(other, foreignKey, Oracle::paired), null);
                }
                case "table_group_by" -> {
                    long k = step.get("k").asLong();
                    result = new Built(((KTable<Long, Long>) up).groupBy(
                            (key, v) -> KeyValue.pair(Math.floorMod(v, k), v),
                            Grouped.with(Serdes.Long(), Serdes.Long())), null);
                }
                case "stream_join" -> {
                    KStream<Long, Long> other = (KStream<Long, Long>) built.get(step.get("other").asInt()).value();
                    KStream<Long, Long> stream = (KStream<Long, Long>) up;
                    long before = step.get("before").asLong();
                    long after = step.get("after").asLong();
                    long grace = step.get("grace").asLong();
                    JoinWindows windows = JoinWindows.ofTimeDifferenceAndGrace(Duration.ofMillis(before),
                            Duration.ofMillis(grace)).after(Duration.ofMillis(after));
                    // In memory, as the driver starts afresh for every request; sized as
                    // Kafka Streams sizes its own join stores.
                    Duration retention = Duration.ofMillis(before + after + grace);
                    Duration windowSize = Duration.ofMillis(before + after);
                    StreamJoined<Long, Long, Long> joined = StreamJoined
                            .<Long, Long, Long>with(
                                    Stores.inMemoryWindowStore("join-this-" + i, retention, windowSize, true),
                                    Stores.inMemoryWindowStore("join-other-" + i, retention, windowSize, true))
                            .withKeySerde(Serdes.Long()).withValueSerde(Serdes.Long())
                            .withOtherValueSerde(Serdes.Long());
                    result = new Built(switch (step.get("kind").asText()) {
                        case "inner" -> stream.join(other, Oracle::paired, windows, joined);
                        case "left" -> stream.leftJoin(other, Oracle::paired, windows, joined);
                        default -> stream.outerJoin(other, Oracle::paired, windows, joined);
                    }, null);
                }
                case "join", "left_join" -> {
                    KTable<Long, Long> table = (KTable<Long, Long>) built.get(step.get("table").asInt()).value();
                    KStream<Long, Long> stream = (KStream<Long, Long>) up;
                    result = new Built(op.equals("join")
                            ? stream.join(table, (v, t) -> joined(v, t))
                            : stream.leftJoin(table, (v, t) -> joined(v, t)), null);
                }
                case "to" -> {
                    String topic = step.get("topic").asText();
                    if (size == null) {
                        ((KStream<Long, Long>) up).to(topic, Produced.with(Serdes.Long(), Serdes.Long()));
                    } else if ("session".equals(windowKind)) {
                        Serde<Windowed<Long>> keys = WindowedSerdes.sessionWindowedSerdeFrom(Long.class);
                        ((KStream<Windowed<Long>, Long>) up).to(topic, Produced.with(keys, Serdes.Long()));
                    } else {
                        Serde<Windowed<Long>> keys = WindowedSerdes.timeWindowedSerdeFrom(Long.class, size);
                        ((KStream<Windowed<Long>, Long>) up).to(topic, Produced.with(keys, Serdes.Long()));
                    }
                    sinks.add(new Sink(topic, size, windowKind));
                    result = null;
                }
                default -> throw new IllegalArgumentException("unknown op " + op);
            }
            built.put(i, result);
        }
    }

    @SuppressWarnings("unchecked")
    private static Object aggregate(String op, JsonNode step, Object up, String name, Built from) {
        String fn = step.has("fn") ? step.get("fn").asText() : "";
        long init = step.has("init") ? step.get("init").asLong() : 0;
        if (up instanceof KGroupedTable) {
            // Sums only: an adder needs a subtractor.
            KGroupedTable<Long, Long> grouped = (KGroupedTable<Long, Long>) up;
            Materialized<Long, Long, KeyValueStore<Bytes, byte[]>> store = Materialized
                    .<Long, Long>as(Stores.inMemoryKeyValueStore(name))
                    .withKeySerde(Serdes.Long()).withValueSerde(Serdes.Long());
            return switch (op) {
                case "count" -> grouped.count(store);
                case "reduce" -> grouped.reduce((a, v) -> a + v, (a, v) -> a - v, store);
                default -> grouped.aggregate(() -> init, (k, v, agg) -> agg + v, (k, v, agg) -> agg - v, store);
            };
        }
        if (up instanceof SessionWindowedKStream) {
            SessionWindowedKStream<Long, Long> sessions = (SessionWindowedKStream<Long, Long>) up;
            // Retained for gap + grace, Kafka Streams' default.
            Materialized<Long, Long, SessionStore<Bytes, byte[]>> store = Materialized
                    .<Long, Long>as(Stores.inMemorySessionStore(name,
                            Duration.ofMillis(from.windowSize() + from.grace())))
                    .withKeySerde(Serdes.Long()).withValueSerde(Serdes.Long());
            return switch (op) {
                case "count" -> sessions.count(store);
                case "reduce" -> sessions.reduce((a, b) -> combine(fn, a, b), store);
                default -> sessions.aggregate(() -> init, (k, v, agg) -> combine(fn, agg, v),
                        (k, a, b) -> combine(fn, a, b), store);
            };
        }
        if (up instanceof TimeWindowedKStream) {
            TimeWindowedKStream<Long, Long> windowed = (TimeWindowedKStream<Long, Long>) up;
            // Retained for size + grace (2 x time difference + grace for sliding windows),
            // Kafka Streams' defaults; in memory, as the driver starts afresh for every request.
            Duration retention = Duration.ofMillis(from.windowSize() + from.grace()
                    + ("sliding".equals(from.windows()) ? from.windowSize() : 0));
            Materialized<Long, Long, WindowStore<Bytes, byte[]>> store = Materialized
                    .<Long, Long>as(Stores.inMemoryWindowStore(name, retention,
                            Duration.ofMillis(from.windowSize()), false))
                    .withKeySerde(Serdes.Long()).withValueSerde(Serdes.Long());
            return switch (op) {
                case "count" -> windowed.count(store);
                case "reduce" -> windowed.reduce((a, b) -> combine(fn, a, b), store);
                default -> windowed.aggregate(() -> init, (k, v, agg) -> combine(fn, agg, v), store);
            };
        }
        KGroupedStream<Long, Long> grouped = (KGroupedStream<Long, Long>) up;
        Materialized<Long, Long, KeyValueStore<Bytes, byte[]>> store = Materialized
                .<Long, Long>as(Stores.inMemoryKeyValueStore(name))
                .withKeySerde(Serdes.Long()).withValueSerde(Serdes.Long());
        return switch (op) {
            case "count" -> grouped.count(store);
            case "reduce" -> grouped.reduce((a, b) -> combine(fn, a, b), store);
            default -> grouped.aggregate(() -> init, (k, v, agg) -> combine(fn, agg, v), store);
        };
    }

    /**
     * The reducers and aggregators of the vocabulary: sum and max; a null on either side
     * gives the other (a windowed aggregation hands null values to its aggregator).
     */
    private static Long combine(String fn, Long aggregate, Long value) {
        if (aggregate == null || value == null) {
            return aggregate == null ? value : aggregate;
        }
        return switch (fn) {
            case "sum" -> aggregate + value;
            case "max" -> Math.max(aggregate, value);
            default -> throw new IllegalArgumentException("unknown function " + fn);
        };
    }

    /** The joiner of the vocabulary: the sum, or -1 - value without a table value. */
    private static Long joined(Long value, Long tableValue) {
        if (value == null) {
            return null;
        }
        return tableValue == null ? -1 - value : value + tableValue;
    }

    /**
     * The joiner of table-table, foreign-key and stream-stream joins: the sum, -1 - left
     * without a right value, -100 - right without a left value.
     */
    private static Long paired(Long left, Long right) {
        if (left == null) {
            return right == null ? null : -100 - right;
        }
        return right == null ? -1 - left : left + right;
    }

    private static Long longOrNull(JsonNode node) {
        return node == null || node.isNull() ? null : node.asLong();
    }

    private static void addLong(ArrayNode array, Long value) {
        if (value == null) {
            array.addNull();
        } else {
            array.add(value);
        }
    }
}
