// Command luaexp measures the time Redis spends inside one version of
// tollgate's script per decision, so that two versions of lua/tokenbucket.lua
// can be compared on one server:
//
//	luaexp -redis 127.0.0.1:6379 -script ../lua/tokenbucket.lua -g 32 -hot
//
// It sends -n calls of -g groups of one bucket each (a merged call of -g
// Takes, as batching sends them; -g 1 is a lone Take), on 100,000 keys or
// (-hot) all on one, and prints usec of INFO commandstats per decision for
// each command Redis ran. It flushes the server's keys and statistics first:
// point it at a server of its own.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "luaexp:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		addr   = flag.String("redis", "", "address of a redis-server of its own (required: its keys are flushed)")
		src    = flag.String("script", "../lua/tokenbucket.lua", "the script to run")
		groups = flag.Int("g", 32, "groups (Takes) per call")
		calls  = flag.Int("n", 2000, "calls")
		hot    = flag.Bool("hot", false, "every Take on one key")
	)
	flag.Parse()
	if *addr == "" || *groups < 1 || *calls < 1 {
		return errors.New("-redis is required, -g and -n at least 1")
	}
	b, err := os.ReadFile(*src)
	if err != nil {
		return err
	}
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: *addr})
	defer c.Close()
	sha, err := c.ScriptLoad(ctx, string(b)).Result()
	if err == nil {
		err = c.FlushAll(ctx).Err()
	}
	if err == nil {
		err = c.ConfigResetStat(ctx).Err()
	}
	if err != nil {
		return err
	}
	// 10⁷ tokens per second, burst 10⁸: every Take allowed, state with a fraction.
	const k, capacity, q = 1, 100_000_000, 10
	for i := range *calls {
		args := []any{"evalsha", sha, *groups}
		for g := range *groups {
			key := "k:" + strconv.Itoa((i**groups+g)%100_000)
			if *hot {
				key = "hot"
			}
			args = append(args, key)
		}
		for range *groups {
			args = append(args, 1, k, capacity, q)
		}
		if err := c.Do(ctx, args...).Err(); err != nil {
			return err
		}
	}
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return err
	}
	decisions := float64(*calls * *groups)
	for _, line := range strings.Split(info, "\n") {
		// cmdstat_evalsha:calls=2000,usec=45000,usec_per_call=22.50,...
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || strings.Contains(name, "config") {
			continue
		}
		fields := map[string]float64{}
		for _, f := range strings.Split(stats, ",") {
			if k, v, ok := strings.Cut(f, "="); ok {
				fields[k], _ = strconv.ParseFloat(v, 64)
			}
		}
		fmt.Printf("%-8s %8.0f calls %7.2f µs per decision\n", strings.TrimPrefix(name, "cmdstat_"), fields["calls"], fields["usec"]/decisions)
	}
	return nil
}
