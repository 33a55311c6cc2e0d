// Takes an Apache Curator InterProcessMutex on a path, for the interop tests.
//
// Usage: java CuratorLock <connect string> <lock path>
// Prints "connected", then "acquired" once it holds the lock, waits for a
// line on stdin, releases, prints "released" and exits.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

public final class CuratorLock {
    private CuratorLock() {}

    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.newClient(args[0], 10000, 5000, new RetryOneTime(100));
        client.start();
        if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
            System.out.println("not connected");
            System.exit(2);
        }
        System.out.println("connected");
        System.out.flush();
        InterProcessMutex mutex = new InterProcessMutex(client, args[1]);
        mutex.acquire();
        System.out.println("acquired");
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        in.readLine();
        mutex.release();
        System.out.println("released");
        System.out.flush();
        client.close();
    }
}
