package app

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/dashboard"
	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
)

// TestE2EDashboardSeesReplicas: the dashboard of one replica lists every
// replica sharing its Redis (by host and pid), and one that stops drops
// off the list.
func TestE2EDashboardSeesReplicas(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	rds := testutil.StartRedis(t)
	s := newE2ESim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicas(t, 3, gatewayConfig{Store: rds.URL(), SimURL: s.url, LogLevel: "info"})
	host, _ := os.Hostname()
	var want []string
	for _, r := range reps {
		want = append(want, host+":"+strconv.Itoa(r.Cmd.Process.Pid))
	}
	slices.Sort(want)

	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, reps[0].URL+"/dashboard/events", nil)
	req.Header.Set("Authorization", "Bearer "+e2eutil.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("events: %d", resp.StatusCode)
	}
	events := bufio.NewReader(resp.Body)
	seen := func(what string, ok func([]string) bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			line, err := events.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			data, found := strings.CutPrefix(line, "data: ")
			if !found {
				continue
			}
			var snap dashboard.Snapshot
			if err := json.Unmarshal([]byte(data), &snap); err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, r := range snap.Replicas {
				names = append(names, r.Name)
			}
			slices.Sort(names)
			if ok(names) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the dashboard lists %v", what, names)
			}
		}
	}
	seen("all three", func(names []string) bool { return slices.Equal(names, want) })
	reps[2].Stop(t)
	gone := host + ":" + strconv.Itoa(reps[2].Cmd.Process.Pid)
	seen("the stopped one gone", func(names []string) bool { return len(names) == 2 && !slices.Contains(names, gone) })
}
