package relay.peers;

import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * Ends a peer app that never starts running. A broker that cannot form Kafka Streams' group
 * (Tansu: see docs/kafka-streams.md) would leave it waiting for ever: past BENCH_JOIN_TIMEOUT_S
 * (default 120) without reaching RUNNING, the app says so and stops with exit code 2.
 */
final class JoinWatchdog {
    private JoinWatchdog() {}

    static void start(String app, Map<String, String> env, CountDownLatch running,
                      CountDownLatch stop, int[] exitCode) {
        long joinTimeoutS = Long.parseLong(env.getOrDefault("BENCH_JOIN_TIMEOUT_S", "120"));
        Thread watchdog = new Thread(() -> {
            try {
                if (!running.await(joinTimeoutS, TimeUnit.SECONDS)) {
                    System.err.println(app + ": the group did not form within " + joinTimeoutS
                            + " s (no task assigned); does the broker serve Kafka Streams' "
                            + "consumer? On Tansu it does not: its stream thread's consumer is "
                            + "disconnected at every ApiVersions to the group coordinator");
                    exitCode[0] = 2;
                    stop.countDown();
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }, "join-watchdog");
        watchdog.setDaemon(true);
        watchdog.start();
    }
}
