package relay.peers;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.Consumer;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.TaskMetadata;
import org.apache.kafka.streams.ThreadMetadata;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.StandbyUpdateListener;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.processor.TaskId;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.processor.internals.DefaultKafkaClientSupplier;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;
import sun.misc.Signal;

/**
 * The app of benchmarks.scaling in Kafka Streams, doing what benchmarks/scaling_app.py does in
 * Relay: per key a running count and the last payload in a persistent RocksDB store called
 * "state" (changelog {@code <application.id>-state-changelog}, keys the input's bytes, values
 * the msgpack map {"n", "blob"}), and for every record an output {"n", "task", "pid", "t",
 * "seq"} on the output topic. One stream thread, caching off, static membership (the
 * instance id the benchmark gives), the HighAvailabilityTaskAssignor with the warm-up and
 * standby settings the benchmark gives (BENCH_* variables).
 *
 * <p>Kafka Streams publishes nothing like Relay's member status, so this app publishes its
 * own, every half second, on BENCH_STATUS (msgpack, keyed by instance and pid): its consumer
 * generation, active and standby tasks, active tasks restoring, and changelog records
 * restored by actives and standbys (warm-ups included). It writes a tombstone as it exits.
 *
 * <p>SIGTERM closes the app as Kafka Streams does by default: a static member stays in the
 * group, so its tasks move once its session times out. SIGUSR1 closes it with
 * {@code CloseOptions.groupMembershipOperation(LEAVE_GROUP)}: it leaves the group at once,
 * which is what Kafka Streams offers where Relay hands work over (it has no leaving mark).
 */
public final class ScalingApp {
    private static final long PID = ProcessHandle.current().pid();
    private static final String STORE = "state";
    private static final AtomicInteger GENERATION = new AtomicInteger(-1);
    private static final AtomicInteger REBALANCES = new AtomicInteger();
    private static final AtomicLong RESTORED = new AtomicLong();
    private static final Set<String> RESTORING = ConcurrentHashMap.newKeySet();

    public static void main(String[] args) throws Exception {
        Map<String, String> env = System.getenv();
        String instance = env.get("BENCH_INSTANCE");
        int standbys = Integer.parseInt(env.getOrDefault("BENCH_STANDBYS", "0"));
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, env.get("BENCH_APP_ID"));
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, env.get("BENCH_BOOTSTRAP"));
        props.put(StreamsConfig.STATE_DIR_CONFIG, env.get("BENCH_STATE_DIR"));
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Integer.parseInt(env.get("BENCH_COMMIT_MS")));
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.AT_LEAST_ONCE);
        props.put(StreamsConfig.NUM_STANDBY_REPLICAS_CONFIG, standbys);
        props.put(StreamsConfig.MAX_WARMUP_REPLICAS_CONFIG, Integer.parseInt(env.get("BENCH_MAX_WARMUPS")));
        props.put(StreamsConfig.ACCEPTABLE_RECOVERY_LAG_CONFIG, Long.parseLong(env.get("BENCH_ACCEPTABLE_LAG")));
        props.put(StreamsConfig.PROBING_REBALANCE_INTERVAL_MS_CONFIG, Long.parseLong(env.get("BENCH_PROBING_MS")));
        // Stated rather than left to the default: the assignor whose warm-ups are measured.
        props.put(StreamsConfig.InternalConfig.INTERNAL_TASK_ASSIGNOR_CLASS,
                "org.apache.kafka.streams.processor.internals.assignment.HighAvailabilityTaskAssignor");
        props.put(StreamsConfig.consumerPrefix("group.instance.id"), instance);
        props.put(StreamsConfig.consumerPrefix("session.timeout.ms"),
                Integer.parseInt(env.get("BENCH_SESSION_TIMEOUT_MS")));
        props.put(StreamsConfig.consumerPrefix("heartbeat.interval.ms"), 1000);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        props.put("enable.metrics.push", false);
        props.put("processing.exception.handler.global.enabled", true);  // silences a warning

        StreamsBuilder builder = new StreamsBuilder();
        builder.addStateStore(Stores.keyValueStoreBuilder(
                Stores.persistentKeyValueStore(STORE), Serdes.Bytes(), Serdes.ByteArray())
                .withCachingDisabled());
        builder.stream(env.get("BENCH_INPUT"), Consumed.with(Serdes.Bytes(), Serdes.ByteArray()))
                .process(Track::new, STORE)
                .to(env.get("BENCH_OUTPUT"), Produced.with(Serdes.Bytes(), Serdes.ByteArray()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props, new GenerationSupplier());
        CountDownLatch stop = new CountDownLatch(1);
        CloseOptions.GroupMembershipOperation[] onClose = {CloseOptions.GroupMembershipOperation.DEFAULT};
        int[] exitCode = {0};
        streams.setUncaughtExceptionHandler(error -> {
            System.err.println("kafka-streams scaling app: " + error);
            exitCode[0] = 1;
            stop.countDown();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        CountDownLatch running = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING) {
                running.countDown();
            }
            if (now == KafkaStreams.State.REBALANCING) {
                REBALANCES.incrementAndGet();
            }
        });
        streams.setGlobalStateRestoreListener(new Restores());
        streams.setStandbyUpdateListener(new StandbyUpdates());
        JoinWatchdog.start("kafka-streams scaling app", env, running, stop, exitCode);
        Signal.handle(new Signal("TERM"), signal -> stop.countDown());
        Signal.handle(new Signal("INT"), signal -> stop.countDown());
        Signal.handle(new Signal("USR1"), signal -> {
            onClose[0] = CloseOptions.GroupMembershipOperation.LEAVE_GROUP;
            stop.countDown();
        });
        StatusPublisher status = new StatusPublisher(env, instance, standbys, streams);
        status.start();
        streams.start();
        stop.await();
        streams.close(CloseOptions.groupMembershipOperation(onClose[0])
                .withTimeout(Duration.ofSeconds(30)));
        status.finish();
        System.exit(exitCode[0]);
    }

    /** Per key, the running count and the last payload; one output per record. */
    static final class Track implements Processor<Bytes, byte[], Bytes, byte[]> {
        private ProcessorContext<Bytes, byte[]> context;
        private KeyValueStore<Bytes, byte[]> state;
        private String task;

        @Override
        public void init(ProcessorContext<Bytes, byte[]> context) {
            this.context = context;
            this.state = context.getStateStore(STORE);
            this.task = context.taskId().toString();
        }

        @Override
        public void process(Record<Bytes, byte[]> record) {
            Map<String, Object> value = MsgPack.readMap(record.value());
            byte[] previous = state.get(record.key());
            long count = 1 + (previous == null ? 0
                    : ((Number) MsgPack.readMap(previous).get("n")).longValue());
            state.put(record.key(), MsgPack.map().put("n", count).put("blob", value.get("blob")).bytes());
            Object seq = value.getOrDefault("seq", -1L);
            context.forward(record.withValue(MsgPack.map().put("n", count).put("task", task)
                    .put("pid", PID).put("t", System.currentTimeMillis() / 1000.0)
                    .put("seq", seq).bytes()));
        }
    }

    /** The stream thread's consumer, which notes its group generation after every poll. */
    static final class GenerationConsumer extends KafkaConsumer<byte[], byte[]> {
        GenerationConsumer(Map<String, Object> config) {
            super(config, new ByteArrayDeserializer(), new ByteArrayDeserializer());
        }

        @Override
        public ConsumerRecords<byte[], byte[]> poll(Duration timeout) {
            ConsumerRecords<byte[], byte[]> records = super.poll(timeout);
            try {
                GENERATION.set(groupMetadata().generationId());
            } catch (RuntimeException e) {
                // Not in a group at this moment: the last generation stands.
            }
            return records;
        }
    }

    static final class GenerationSupplier extends DefaultKafkaClientSupplier {
        @Override
        public Consumer<byte[], byte[]> getConsumer(Map<String, Object> config) {
            return new GenerationConsumer(config);
        }
    }

    /** Active tasks restoring, and changelog records they restored. */
    static final class Restores implements StateRestoreListener {
        @Override
        public void onRestoreStart(TopicPartition partition, String store, long start, long end) {
            RESTORING.add(taskOf(partition));
        }

        @Override
        public void onBatchRestored(TopicPartition partition, String store, long batchEnd, long restored) {
            RESTORED.addAndGet(restored);
        }

        @Override
        public void onRestoreEnd(TopicPartition partition, String store, long restored) {
            RESTORING.remove(taskOf(partition));
        }

        @Override
        public void onRestoreSuspended(TopicPartition partition, String store, long restored) {
            RESTORING.remove(taskOf(partition));
        }
    }

    /** Changelog records applied by standby tasks (warm-ups are standby tasks too). */
    static final class StandbyUpdates implements StandbyUpdateListener {
        @Override
        public void onUpdateStart(TopicPartition partition, String store, long start) {
        }

        @Override
        public void onBatchLoaded(TopicPartition partition, String store, TaskId task, long batchEnd,
                                  long batchSize, long currentEnd) {
            RESTORED.addAndGet(batchSize);
        }

        @Override
        public void onUpdateSuspended(TopicPartition partition, String store, long storeOffset,
                                      long currentEnd, SuspendReason reason) {
        }
    }

    /** The one subtopology's task of a changelog partition. */
    static String taskOf(TopicPartition changelog) {
        return "0_" + changelog.partition();
    }

    /** Publishes this member's status every half second, and a tombstone at the end. */
    static final class StatusPublisher extends Thread {
        private final KafkaProducer<byte[], byte[]> producer;
        private final String topic;
        private final byte[] key;
        private final String instance;
        private final int standbys;
        private final KafkaStreams streams;
        private volatile boolean done;

        StatusPublisher(Map<String, String> env, String instance, int standbys, KafkaStreams streams) {
            super("bench-status");
            setDaemon(true);
            Properties props = new Properties();
            props.put("bootstrap.servers", env.get("BENCH_BOOTSTRAP"));
            props.put("enable.metrics.push", false);
            props.put("linger.ms", 0);
            this.producer = new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
            this.topic = env.get("BENCH_STATUS");
            // Keyed by process as well: a restarted instance starts its counters from zero,
            // and the benchmark counts each key's records restored from its first record.
            this.key = (instance + "/" + PID).getBytes(java.nio.charset.StandardCharsets.UTF_8);
            this.instance = instance;
            this.standbys = standbys;
            this.streams = streams;
        }

        @Override
        public void run() {
            while (!done) {
                try {
                    producer.send(new ProducerRecord<>(topic, 0, key, record()));
                    Thread.sleep(500);
                } catch (InterruptedException e) {
                    return;
                } catch (RuntimeException e) {
                    System.err.println("kafka-streams scaling app: status not published: " + e);
                }
            }
        }

        private byte[] record() {
            Set<String> active = new TreeSet<>();
            Set<String> standby = new TreeSet<>();
            try {
                for (ThreadMetadata thread : streams.metadataForLocalThreads()) {
                    for (TaskMetadata task : thread.activeTasks()) {
                        active.add(task.taskId().toString());
                    }
                    for (TaskMetadata task : thread.standbyTasks()) {
                        standby.add(task.taskId().toString());
                    }
                }
            } catch (RuntimeException e) {
                // Not started yet, or closing: no tasks to report.
            }
            return MsgPack.map().put("instance", instance).put("pid", PID)
                    .put("generation", (long) GENERATION.get())
                    .put("state", streams.state().name())
                    .put("active", new ArrayList<>(active)).put("standby", new ArrayList<>(standby))
                    .put("restoring", new ArrayList<>(new TreeSet<>(RESTORING)))
                    .put("standbys_configured", (long) standbys)
                    .put("rebalances", (long) REBALANCES.get())
                    .put("restored_records", RESTORED.get())
                    .put("updated_ms", System.currentTimeMillis()).bytes();
        }

        /** Stop publishing and remove this member's record. */
        void finish() throws InterruptedException {
            done = true;
            interrupt();
            join(2000);
            try {
                producer.send(new ProducerRecord<>(topic, 0, key, null)).get(5, TimeUnit.SECONDS);
            } catch (Exception e) {
                System.err.println("kafka-streams scaling app: status tombstone not written: " + e);
            }
            producer.close(Duration.ofSeconds(5));
        }
    }
}
