// Takes one of Apache Curator's read-write lock sides or a semaphore permit
// on a path, for the interop tests.
//
// Usage: java CuratorPrimitive <connect string> <read|write|semaphore> <path> [permits] [timeout ms]
// Prints "connected", then "acquired" once it holds (or "timeout" and exits
// when a timeout was given and ran out first), waits for a line on stdin,
// releases, prints "released" and exits.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryOneTime;

public final class CuratorPrimitive {
    private CuratorPrimitive() {}

    private interface Hold {
        void release() throws Exception;
    }

    private static void say(String word) {
        System.out.println(word);
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
        String kind = args[1];
        String path = args[2];
        int permits = args.length > 3 ? Integer.parseInt(args[3]) : 1;
        long timeoutMs = args.length > 4 ? Long.parseLong(args[4]) : -1;
        Hold hold = null;
        if (kind.equals("semaphore")) {
            InterProcessSemaphoreV2 semaphore = new InterProcessSemaphoreV2(client, path, permits);
            Lease lease = timeoutMs < 0 ? semaphore.acquire() : semaphore.acquire(timeoutMs, TimeUnit.MILLISECONDS);
            if (lease != null) {
                hold = lease::close;
            }
        } else {
            InterProcessReadWriteLock both = new InterProcessReadWriteLock(client, path);
            InterProcessMutex side = kind.equals("read") ? both.readLock() : both.writeLock();
            boolean got = true;
            if (timeoutMs < 0) {
                side.acquire();
            } else {
                got = side.acquire(timeoutMs, TimeUnit.MILLISECONDS);
            }
            if (got) {
                hold = side::release;
            }
        }
        if (hold == null) {
            say("timeout");
            client.close();
            return;
        }
        say("acquired");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        in.readLine();
        hold.release();
        say("released");
        client.close();
    }
}
