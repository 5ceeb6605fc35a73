package relay.peers;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
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
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TimeWindowedDeserializer;
import org.apache.kafka.streams.kstream.TimeWindowedKStream;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.kstream.WindowedSerdes;
import org.apache.kafka.streams.state.KeyValueStore;
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
     * size (and grace) when its keys are windowed.
     */
    private record Built(Object value, Long windowSize, long grace) {
        Built(Object value, Long windowSize) {
            this(value, windowSize, 0);
        }
    }

    /** An output topic and how to read its keys. */
    private record Sink(String topic, Long windowSize) {}

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

    static ObjectNode run(JsonNode request) {
        StreamsBuilder builder = new StreamsBuilder();
        List<Sink> sinks = new ArrayList<>();
        List<String> sources = new ArrayList<>();
        build(builder, request.get("topology").get("steps"), sinks, sources);
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, "oracle");
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, "127.0.0.1:1");
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
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
        if (sink.windowSize() == null) {
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
                ArrayNode record = records.addArray();
                ArrayNode key = record.addArray();
                addLong(key, r.key().key());
                key.add(r.key().window().start());
                key.add(r.key().window().end());
                addLong(record, r.value());
                record.add(r.timestamp());
            }
        }
        return records;
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
                    result = new Built(((KStream<Object, Long>) up)
                            .filter((key, v) -> v != null && Math.floorMod(v, k) == r), size);
                }
                case "map_values" -> {
                    long a = step.get("a").asLong();
                    long b = step.get("b").asLong();
                    result = new Built(((KStream<Object, Long>) up)
                            .mapValues(v -> v == null ? null : a * v + b), size);
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
                            step.get("grace").asLong());
                }
                case "count", "reduce", "aggregate" ->
                        result = new Built(aggregate(op, step, up, "store-" + i, from), size);
                case "to_stream" -> result = new Built(((KTable<Object, Long>) up).toStream(), size);
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
                    } else {
                        Serde<Windowed<Long>> keys = WindowedSerdes.timeWindowedSerdeFrom(Long.class, size);
                        ((KStream<Windowed<Long>, Long>) up).to(topic, Produced.with(keys, Serdes.Long()));
                    }
                    sinks.add(new Sink(topic, size));
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
        if (up instanceof TimeWindowedKStream) {
            TimeWindowedKStream<Long, Long> windowed = (TimeWindowedKStream<Long, Long>) up;
            // Retained for size + grace, Kafka Streams' default; in memory, as the driver
            // starts afresh for every request.
            Duration retention = Duration.ofMillis(from.windowSize() + from.grace());
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
