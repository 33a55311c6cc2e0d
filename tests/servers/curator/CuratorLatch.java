// Runs one Apache Curator LeaderLatch on a path, for the election interop tests.
//
// Usage: java CuratorLatch <connect string> <path> <participant id>
// Prints "connected", then "leader" whenever this latch becomes leader and
// "not leader" whenever it stops being one. Reads commands on stdin:
// "who" prints "leader-is <id>" (Curator's getLeader(), read from the
// server); "go" (or the end of stdin) closes the latch, prints "closed" and exits.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderLatchListener;
import org.apache.curator.retry.RetryOneTime;

public final class CuratorLatch {
    private CuratorLatch() {}

    private static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.newClient(args[0], 10000, 5000, new RetryOneTime(100));
        client.start();
        if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
            say("not connected");
            System.exit(2);
        }
        say("connected");
        LeaderLatch latch = new LeaderLatch(client, args[1], args[2]);
        latch.addListener(new LeaderLatchListener() {
            @Override
            public void isLeader() {
                say("leader");
            }

            @Override
            public void notLeader() {
                say("not leader");
            }
        });
        latch.start();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null && !line.trim().equals("go")) {
            if (line.trim().equals("who")) {
                say("leader-is " + latch.getLeader().getId());
            }
        }
        latch.close();
        say("closed");
        client.close();
    }
}
