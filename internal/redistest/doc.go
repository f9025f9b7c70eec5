// Package redistest runs real redis-server processes for tests.
//
// Server starts a single redis-server on a free port of 127.0.0.1, with
// persistence switched off (--save "" --appendonly no) and a working
// directory inside the test's temporary directory. The returned Instance can
// pause (SIGSTOP), resume (SIGCONT), kill (SIGKILL) and restart the process on
// the same port, which lets tests exercise timeouts, outages and recovery
// against the real server rather than a fake one.
//
// Cluster starts a Redis Cluster made of such processes: three masters by
// default, optionally with replicas, joined with "redis-cli --cluster create".
// It returns only once every node reports cluster_state:ok, every replica is
// in sync with its master, and a go-redis ClusterClient can reach every shard
// and write to every slot range.
//
// Sentinel starts a master, one replica and three Redis Sentinel processes
// (redis-server --sentinel) that monitor the master. It returns only once the
// replica is in sync and every sentinel knows the master, the replica and the
// other sentinels, so that killing the master leads to a failover within a few
// seconds. A go-redis failover client follows the master through it.
//
// Every process is stopped in t.Cleanup, whatever state it is in: a paused
// process is continued and then sent SIGTERM, and one that does not exit
// within about two seconds is sent SIGKILL. Each process runs in its own
// process group, so a Ctrl-C at the terminal reaches only the test binary, and
// on Linux it is started with a parent-death signal of SIGKILL, so it does not
// outlive a test binary that is killed. The output of each process goes to a
// log file in its temporary directory, and the tail of that log is included
// in failure messages.
//
// Ports are taken by listening on 127.0.0.1:0 and closing the listener. If
// another process takes the port before redis-server binds it, the server is
// started again on another port, a few times at most. Readiness is checked
// against the process ID reported by INFO, so a test never mistakes another
// package's server for its own. This makes the package safe for "go test
// ./..." running several packages at once.
//
// # Environment
//
// If REDIS_ADDR is set (host:port), Server starts nothing and returns an
// external Instance for that address. If REDIS_CLUSTER_ADDRS is set (a
// comma-separated list of host:port), Cluster starts nothing and returns an
// external ClusterInstance for those nodes. If REDIS_SENTINEL_ADDRS is set (a
// comma-separated list of host:port of sentinels), Sentinel starts nothing and
// returns an external SentinelInstance for the master named by
// REDIS_SENTINEL_MASTER (by default the name given with MasterName, or
// "mymaster"). External servers are not flushed and may be shared with other
// tests and other packages, so tests that may run against them must use
// unique key prefixes. Methods that send signals (Pause, Resume, Kill,
// Restart) call t.Skip on external instances, because a process that the
// test did not start cannot be signalled.
//
// When redis-server (or, for Cluster, redis-cli) is not on PATH and no
// external address is given, the test is skipped with a message starting with
// "REDIS NOT INSTALLED", which is also printed once to standard error so that
// it is not lost in a quiet "go test" run. When the environment variable CI is
// true, the test fails instead, because CI must have redis-server installed
// (.ci/run installs it).
package redistest
