package relay.peers;

import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.lang.management.ManagementFactory;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import sun.misc.Signal;

/**
 * The counting app of benchmarks.throughput in Kafka Streams: a count per key in a RocksDB store
 * with a changelog, every update sent on (caching off), one stream thread, the commit interval and
 * processing guarantee the benchmark gives (BENCH_* variables, as the Python workers read them).
 *
 * <p>Keys stay the input's bytes (msgpack strings); a count goes out as a msgpack integer. Each
 * record done is counted, and a daemon thread writes "count wall-seconds cpu-seconds" to the pipe
 * the benchmark passed (BENCH_PROGRESS_FD), every BENCH_PROGRESS_S seconds. SIGTERM closes the
 * app (it commits) and exits 0.
 */
public final class CountingApp {
    private static final AtomicLong DONE = new AtomicLong();

    public static void main(String[] args) throws Exception {
        Map<String, String> env = System.getenv();
        String guarantee = env.getOrDefault("BENCH_GUARANTEE", "at_least_once");
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, env.get("BENCH_GROUP"));
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, env.get("BENCH_BOOTSTRAP"));
        props.put(StreamsConfig.STATE_DIR_CONFIG, env.get("BENCH_STATE_DIR"));
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Integer.parseInt(env.get("BENCH_COMMIT_MS")));
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG,
                guarantee.equals("exactly_once") ? StreamsConfig.EXACTLY_ONCE_V2 : StreamsConfig.AT_LEAST_ONCE);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        // Client telemetry (KIP-714) is no part of the workload, and not every broker has it.
        props.put("enable.metrics.push", false);
        props.put("processing.exception.handler.global.enabled", true);  // silences a warning

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(env.get("BENCH_INPUT"), Consumed.with(Serdes.Bytes(), Serdes.ByteArray()))
                .groupByKey(Grouped.with(Serdes.Bytes(), Serdes.ByteArray()))
                .count(Materialized.as("counts"))
                .toStream()
                .mapValues(CountingApp::msgpackInt)
                .peek((k, v) -> DONE.incrementAndGet())
                .to(env.get("BENCH_OUTPUT"), Produced.with(Serdes.Bytes(), Serdes.ByteArray()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch stop = new CountDownLatch(1);
        int[] exitCode = {0};
        streams.setUncaughtExceptionHandler(error -> {
            System.err.println("kafka-streams counting app: " + error);
            exitCode[0] = 1;
            stop.countDown();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        // A broker that cannot form its group (Tansu: see docs/kafka-streams.md) would leave
        // the app waiting for ever: past BENCH_JOIN_TIMEOUT_S without running, it says so.
        CountDownLatch running = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING) {
                running.countDown();
            }
        });
        JoinWatchdog.start("kafka-streams counting app", env, running, stop, exitCode);
        Signal.handle(new Signal("TERM"), signal -> stop.countDown());
        Signal.handle(new Signal("INT"), signal -> stop.countDown());
        startProgress(env);
        streams.start();
        stop.await();
        streams.close(Duration.ofSeconds(30));
        System.exit(exitCode[0]);
    }

    /** A non-negative count as msgpack encodes it (what Relay's and the peers' outputs hold). */
    static byte[] msgpackInt(Long count) {
        long n = count;
        if (n < 0x80) {
            return new byte[] {(byte) n};
        }
        if (n <= 0xff) {
            return new byte[] {(byte) 0xcc, (byte) n};
        }
        if (n <= 0xffff) {
            return ByteBuffer.allocate(3).put((byte) 0xcd).putShort((short) n).array();
        }
        if (n <= 0xffffffffL) {
            return ByteBuffer.allocate(5).put((byte) 0xce).putInt((int) n).array();
        }
        return ByteBuffer.allocate(9).put((byte) 0xcf).putLong(n).array();
    }

    private static void startProgress(Map<String, String> env) throws IOException {
        String fd = env.get("BENCH_PROGRESS_FD");
        if (fd == null) {
            return;
        }
        long everyMs = Math.round(Double.parseDouble(env.getOrDefault("BENCH_PROGRESS_S", "0.02")) * 1000);
        PrintWriter out = new PrintWriter(new OutputStreamWriter(
                new FileOutputStream("/proc/self/fd/" + fd), StandardCharsets.US_ASCII), true);
        com.sun.management.OperatingSystemMXBean os =
                (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        Thread reporter = new Thread(() -> {
            // Every tick, changed or not: the benchmark interpolates between neighbouring samples.
            while (true) {
                out.printf(Locale.ROOT, "%d %.6f %.6f%n", DONE.get(), System.currentTimeMillis() / 1000.0,
                        os.getProcessCpuTime() / 1e9);
                try {
                    Thread.sleep(Math.max(1, everyMs));
                } catch (InterruptedException e) {
                    return;
                }
            }
        }, "bench-progress");
        reporter.setDaemon(true);
        reporter.start();
    }
}
