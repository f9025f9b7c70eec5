//go:build unix

package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestSentinel(t *testing.T) {
	var pids pidSet
	ctx := context.Background()

	t.Run("setup", func(t *testing.T) {
		s := Sentinel(t)
		if s.External {
			t.Skip("REDIS_SENTINEL_ADDRS is set: this test needs a setup it starts itself")
		}
		for _, n := range s.all() {
			pids.add(n)
		}
		if s.MasterName != "mymaster" || len(s.Replicas) != 1 || len(s.Sentinels) != 3 || len(s.SentinelAddrs) != 3 {
			t.Fatalf("MasterName %q, %d replicas, %d sentinels, %d sentinel addrs; want mymaster, 1, 3, 3",
				s.MasterName, len(s.Replicas), len(s.Sentinels), len(s.SentinelAddrs))
		}
		for k, sn := range s.Sentinels {
			if s.SentinelAddrs[k] != sn.Addr {
				t.Errorf("SentinelAddrs[%d] = %s; want %s", k, s.SentinelAddrs[k], sn.Addr)
			}
			info, err := sn.Client(t).Info(ctx, "server").Result()
			if err != nil || infoField(info, "redis_mode") != "sentinel" {
				t.Errorf("sentinel %s: redis_mode:%s, %v; want sentinel", sn.Addr, infoField(info, "redis_mode"), err)
			}
		}
		if repl, err := s.Replicas[0].Client(t).Info(ctx, "replication").Result(); err != nil ||
			infoField(repl, "role") != "slave" || infoField(repl, "master_port") != strconv.Itoa(s.Master.Port) {
			t.Errorf("replica: role:%s master_port:%s, %v; want a replica of port %d",
				infoField(repl, "role"), infoField(repl, "master_port"), err, s.Master.Port)
		}
		if m := s.CurrentMaster(t); m != s.Master.Addr {
			t.Errorf("CurrentMaster = %s; want %s", m, s.Master.Addr)
		}

		c := s.Client(t)
		const key = "redistest:sentinel"
		if err := c.Set(ctx, key, "before", 0).Err(); err != nil {
			t.Fatalf("FailoverClient SET: %v", err)
		}
		if v, err := c.Get(ctx, key).Result(); err != nil || v != "before" {
			t.Fatalf("FailoverClient GET = %q, %v; want before", v, err)
		}
		if v, err := s.Master.Client(t).Get(ctx, key).Result(); err != nil || v != "before" {
			t.Fatalf("GET on Master = %q, %v; want before (the FailoverClient wrote elsewhere)", v, err)
		}

		t.Run("external", func(t *testing.T) {
			t.Setenv(envSentinelAddrs, strings.Join(s.SentinelAddrs, ","))
			t.Setenv(envSentinelMaster, "")
			ext := Sentinel(t)
			if !ext.External || ext.MasterName != "mymaster" || len(ext.Sentinels) != 3 ||
				!ext.Sentinels[0].External || ext.Master.Addr != s.Master.Addr || !ext.Master.External ||
				len(ext.Replicas) != 1 || ext.Replicas[0].Addr != s.Replicas[0].Addr {
				t.Fatalf("external setup = %+v", ext)
			}
			if v, err := ext.Client(t).Get(ctx, key).Result(); err != nil || v != "before" {
				t.Errorf("external FailoverClient GET = %q, %v", v, err)
			}
			// REDIS_SENTINEL_MASTER wins over MasterName.
			t.Setenv(envSentinelMaster, "mymaster")
			if ext := Sentinel(t, MasterName("other")); ext.MasterName != "mymaster" {
				t.Errorf("MasterName with REDIS_SENTINEL_MASTER set = %q; want mymaster", ext.MasterName)
			}
			// Signals are refused.
			var sub *testing.T
			t.Run("Kill", func(t *testing.T) {
				sub = t
				Sentinel(t).Sentinels[0].Kill()
				t.Errorf("Kill on an external sentinel did not skip")
			})
			if !sub.Skipped() {
				t.Errorf("Kill on an external sentinel: test not skipped")
			}
		})

		// A restarted sentinel comes back from its rewritten configuration:
		// same master, same peers, same replica.
		sn := s.Sentinels[0]
		sn.Kill()
		sn.Restart()
		pids.add(sn)
		s.waitFor(10*time.Second, "restarted sentinel not ready", s.checkSentinels)

		if testing.Short() {
			t.Skip("-short: a failover takes several seconds")
		}
		// The write must reach the replica before its master dies.
		replica := s.Replicas[0]
		rc := replica.Client(t)
		for wait := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			v, err := rc.Get(ctx, key).Result()
			if v == "before" {
				break
			}
			if time.Now().After(wait) {
				t.Fatalf("GET on the replica = %q, %v; want before", v, err)
			}
		}
		start := time.Now()
		s.Master.Kill()

		const bound = 20 * time.Second
		deadline := start.Add(bound)
		for s.CurrentMaster(t) != replica.Addr {
			if time.Now().After(deadline) {
				t.Fatalf("sentinels still report %s as master %v after killing it\n%s",
					s.CurrentMaster(t), bound, s.logTails())
			}
			time.Sleep(100 * time.Millisecond)
		}
		promoted := time.Since(start)

		// The same client, retried until it reaches the new master.
		var err error
		for {
			actx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err = c.Set(actx, key, "after", 0).Err()
			cancel()
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("FailoverClient SET still failing %v after killing the master: %v\n%s", bound, err, s.logTails())
		}
		t.Logf("replica promoted %v, FailoverClient writing again %v after the master was killed",
			promoted.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		if v, err := c.Get(ctx, key).Result(); err != nil || v != "after" {
			t.Errorf("FailoverClient GET after failover = %q, %v; want after", v, err)
		}
		info, err := c.Info(ctx, "server").Result()
		if pid := infoField(info, "process_id"); err != nil || pid != strconv.Itoa(replica.PID()) {
			t.Errorf("FailoverClient talks to pid %s, %v; want the promoted replica's pid %d", pid, err, replica.PID())
		}
		if v, err := rc.Get(ctx, key).Result(); err != nil || v != "after" {
			t.Errorf("GET on the promoted replica = %q, %v; want after", v, err)
		}

		// CurrentMaster skips a paused sentinel, and cleanup stops it.
		s.Sentinels[0].Pause()
		if m := s.CurrentMaster(t); m != replica.Addr {
			t.Errorf("CurrentMaster with a paused sentinel = %s; want %s", m, replica.Addr)
		}
	})

	pids.assertDead(t)
}

// TestSentinelMasterName checks that a master name that cannot be written to
// a configuration file is refused before anything starts.
func TestSentinelMasterName(t *testing.T) {
	t.Setenv(envSentinelAddrs, "")
	for _, name := range []string{"", "a b", `a"b`, "a\nb"} {
		tb := &fakeTB{TB: t}
		runTB(func() { Sentinel(tb, MasterName(name)) })
		if !strings.Contains(tb.fatal, "master name") {
			t.Errorf("MasterName(%q): fatal = %q; want it refused", name, tb.fatal)
		}
	}
}
