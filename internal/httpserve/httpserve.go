// Package httpserve runs the plugin's HTTP servers: started in the
// background with bounded reads, stopped together with a grace period.
package httpserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Start serves h on l in the background; a failure of Serve other than a
// shutdown is sent to errs. A request must arrive whole within
// readTimeout: a client that stalls in its body held a goroutine and a
// descriptor for good.
func Start(l net.Listener, h http.Handler, errs chan<- error, name string, readTimeout time.Duration) *http.Server {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: min(10*time.Second, readTimeout), ReadTimeout: readTimeout,
		IdleTimeout: 5 * time.Minute}
	go func() {
		if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("%s server: %w", name, err)
		}
	}()
	return srv
}

// Shutdown closes every server's listeners at once, lets their requests
// finish for grace, then closes the connections still open.
func Shutdown(log *slog.Logger, grace time.Duration, servers ...*http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	var wg sync.WaitGroup
	for _, srv := range servers {
		wg.Go(func() {
			if err := srv.Shutdown(ctx); err != nil {
				log.Warn("requests open at shutdown", "why", "closing their connections at the end of the grace period", "err", err)
				srv.Close()
			}
		})
	}
	wg.Wait()
}
