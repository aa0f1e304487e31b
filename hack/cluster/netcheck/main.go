// netcheck: the cluster's network probe (in the toolbox image, hack/cluster/build.sh).
//
// Go's own resolver reads the pod's /etc/resolv.conf (search list, ndots) like any program
// would, and the binary is static, so it works in an image FROM scratch; Debian's static
// busybox cannot resolve names there (static glibc needs NSS modules).
//
//	netcheck resolve NAME [SECONDS]   print NAME's addresses; retry until SECONDS pass
//	netcheck get URL [SECONDS]        GET URL, print the body; retry until SECONDS pass
//	netcheck serve ADDR               HTTP server answering "netcheck <hostname>"
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: netcheck resolve NAME [SECONDS] | get URL [SECONDS] | serve ADDR")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "resolve":
		retry(func() error { return resolve(os.Args[2]) })
	case "get":
		retry(func() error { return get(os.Args[2]) })
	case "serve":
		serve(os.Args[2])
	default:
		fmt.Fprintln(os.Stderr, "netcheck: unknown command", os.Args[1])
		os.Exit(2)
	}
}

// retry runs fn every half second until it succeeds or the deadline (argument 3, default 30 s)
// passes: Services and endpoints take a moment to be programmed after a pod starts.
func retry(fn func() error) {
	limit := 30 * time.Second
	if len(os.Args) > 3 {
		s, err := strconv.ParseFloat(os.Args[3], 64)
		if err != nil {
			fmt.Fprintln(os.Stderr, "netcheck: bad SECONDS:", os.Args[3])
			os.Exit(2)
		}
		limit = time.Duration(s * float64(time.Second))
	}
	deadline := time.Now().Add(limit)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "netcheck:", err)
			os.Exit(1)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func resolve(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		fmt.Printf("%s %s\n", name, a)
	}
	return nil
}

func get(url string) error {
	// A fresh connection per attempt: a kept-alive one opened before kube-proxy programmed
	// the Service would keep bypassing it (conntrack remembers the un-NATed flow).
	client := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	os.Stdout.Write(body)
	return nil
}

func serve(addr string) {
	host, _ := os.Hostname()
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "netcheck %s\n", host)
	})
	fmt.Fprintln(os.Stderr, "netcheck: serving on", addr)
	if err := http.ListenAndServe(addr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "netcheck:", err)
		os.Exit(1)
	}
}
