// Command testapp is the one program in the node tests' image: an HTTP server whose endpoints
// make a container do what a test needs (exit, allocate memory, try to write its root fs, stream
// a line a second), and
// client modes for exec probes and for checks from inside a pod (HTTP get, DNS lookup).
// Standard library only, built static (CGO off), so the image is this one file.
package main

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 2 {
		switch os.Args[1] {
		case "get":
			os.Exit(get(os.Args[2]))
		case "lookup":
			os.Exit(lookup(os.Args[2]))
		}
	}
	serve()
}

func get(url string) int {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Print(string(body))
	if resp.StatusCode != http.StatusOK {
		return 1
	}
	return 0
}

func lookup(name string) int {
	addrs, err := net.LookupHost(name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for _, addr := range addrs {
		fmt.Println(addr)
	}
	return 0
}

var hold [][]byte

func serve() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	hostname, _ := os.Hostname()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		log.Printf("request %s %s", r.Method, r.URL.Path)
		fmt.Fprintf(w, "hello from %s\n", hostname)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if _, err := os.Stat("/tmp/unhealthy"); err == nil {
			http.Error(w, "unhealthy", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/whoami", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "uid=%d gid=%d\n", os.Getuid(), os.Getgid())
	})
	mux.HandleFunc("/write", func(w http.ResponseWriter, r *http.Request) {
		err := os.WriteFile(r.URL.Query().Get("path"), []byte("x"), 0o644)
		if err != nil {
			fmt.Fprintf(w, "error: %v\n", err)
			return
		}
		fmt.Fprintln(w, "written")
	})
	mux.HandleFunc("/exit", func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.URL.Query().Get("code"))
		log.Printf("exiting with %d", code)
		fmt.Fprintln(w, "bye")
		go func() { time.Sleep(100 * time.Millisecond); os.Exit(code) }()
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		// A long response, like an engine's token stream: cut short if the process stops.
		lines, _ := strconv.Atoi(r.URL.Query().Get("lines"))
		flusher, _ := w.(http.Flusher)
		for i := 0; i < lines; i++ {
			fmt.Fprintf(w, "line %d\n", i)
			flusher.Flush()
			time.Sleep(time.Second)
		}
		fmt.Fprintln(w, "done")
	})
	mux.HandleFunc("/alloc", func(w http.ResponseWriter, r *http.Request) {
		mb, _ := strconv.Atoi(r.URL.Query().Get("mb"))
		for i := 0; i < mb; i++ {
			chunk := make([]byte, 1<<20)
			for j := range chunk {
				chunk[j] = byte(j)
			}
			hold = append(hold, chunk)
		}
		fmt.Fprintf(w, "allocated %d MiB\n", mb)
	})
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		log.Print("stopping on signal")
		os.Exit(0)
	}()
	log.Printf("listening on :%s as uid %d", port, os.Getuid())
	log.Fatal(http.ListenAndServe(":"+port, mux))
}
