package review

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
)

// The queue of a hostile producer's making (issue 22): 200,000 pending items under 100,000
// distinct question names of about 190 bytes each. An earlier page rendered every name as a
// filter option (41 MB, 1.8 s, 989 MB of memory).
const (
	scaleItems     = 200_000
	scaleDistinct  = 100_000
	scaleNameBytes = 190
)

func scaleName(i int) string {
	n := fmt.Sprintf("hostile-question-%06d-", i)
	return n + strings.Repeat("x", scaleNameBytes-len(n))
}

// scaleServer is a review page without NATS whose index holds n items: the queue page needs
// nothing else. ingest feeds each item through the reader's own decoding (as JSON review
// messages, one run each), else straight into the index.
func scaleServer(tb testing.TB, n, distinct int, ingest bool) *Server {
	tb.Helper()
	pages, err := parsePages()
	if err != nil {
		tb.Fatal(err)
	}
	s := &Server{cfg: DefaultConfig(), idx: newIndex(zerolog.Nop()), pages: pages, log: zerolog.Nop(), now: time.Now}
	s.idx.itemsReady.Store(true)
	s.idx.labelsReady.Store(true)
	base := time.Now().Add(-time.Hour)
	callers := []string{"billing", "support", "sales", "hostile"}
	for i := range n {
		run, question := fmt.Sprintf("run-%07d", i), scaleName(i%distinct)
		conf := float64(i%997) / 997
		caller := callers[i%len(callers)]
		if !ingest {
			s.idx.add(&itemMeta{ID: contract.ReviewItemID(run, question), RunID: run, Caller: caller, Model: "nimble", Question: question,
				Type: contract.TypeNoul, Confidence: conf, HasConfidence: true, Reason: "confidence below 0.50",
				CreatedAt: base.Add(time.Duration(i) * time.Millisecond), Seq: uint64(i + 1)})
			continue
		}
		noul := 0.5
		rr := contract.ReviewRun{RunID: run, Caller: caller, Provider: "ollama", Model: "nimble", Images: []contract.ImageRef{},
			CreatedAt: base.Add(time.Duration(i) * time.Millisecond), State: []byte(`"a short state"`),
			Items: []contract.ReviewItem{{ID: contract.ReviewItemID(run, question), Question: question, Type: contract.TypeNoul,
				Instructions: []byte(`"Is it?"`), Noul: &noul, Confidence: &conf, Mode: contract.ReviewNotify,
				Verdict: contract.Verdict{Status: contract.VerdictAbstained, Rule: "all", Reason: "confidence below 0.50"}}}}
		b, _ := rr.MarshalJSON()
		s.idx.ingestData(wire.ReviewPrefix+caller, uint64(i+1), b)
	}
	if got := s.idx.counts("").Pending; got != n {
		tb.Fatalf("%d pending items indexed, want %d", got, n)
	}
	return s
}

func (s *Server) serveQueue(target string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	s.queuePage(rec, httptest.NewRequest(http.MethodGet, target, nil), &session{User: "alice", CSRF: "t"})
	return rec
}

// TestReviewQueueStaysBoundedWith200kItems: with 200,000 pending items under 100,000 question
// names the queue page is one page of items and the filters' 20 most frequent values — tens of
// kilobytes, not the whole queue — its counts are right, the search box finds any name, a
// filter chosen from outside the 20 stays selected, and paging walks on. (How fast, and how
// much memory the page process takes: BenchmarkReviewQueue200k.)
func TestReviewQueueStaysBoundedWith200kItems(t *testing.T) {
	s := scaleServer(t, scaleItems, scaleDistinct, false)
	rec := s.serveQueue("/")
	body := rec.Body.String()
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /: %d", rec.Code)
	}
	options := strings.Count(body, "<option")
	t.Logf("GET / with %d items: %d bytes, %d options", scaleItems, len(body), options)
	if len(body) > 256<<10 || options > 2*maxFacets+3+5 {
		t.Errorf("the page is %d bytes with %d options", len(body), options)
	}
	if n := strings.Count(body, `href="/items/rv-`); n != queuePageSize+1 { // the items, and "Start reviewing"
		t.Errorf("%d item links, want a page of %d", n, queuePageSize)
	}
	for _, want := range []string{"<strong>200000</strong> pending", `name="search"`, `rel="next"`, "page 1 of 200"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	// The search box finds a name no list shows.
	needle := scaleName(98765)
	found := s.serveQueue("/?search=" + needle[:24]).Body.String()
	if !strings.Contains(found, "2 pending items matching the filters") || !strings.Contains(found, needle) {
		t.Errorf("search for %s did not find its two items", needle[:24])
	}
	// A question picked from outside the 20 most frequent stays selected, with its count.
	picked := s.serveQueue("/?question=" + needle).Body.String()
	if !strings.Contains(picked, `<option value="`+needle+`" selected>`) || !strings.Contains(picked, "2 pending items") {
		t.Errorf("the picked question is not selected or not counted")
	}
	// Deep pages are bounded; page 2 follows page 1.
	if p2 := s.serveQueue("/?page=2").Body.String(); !strings.Contains(p2, "page 2 of 200") || !strings.Contains(p2, `rel="prev"`) {
		t.Error("page 2")
	}
	if deep := s.serveQueue("/?page=99999").Body.String(); !strings.Contains(deep, "page 200 of 200") {
		t.Error("a page past the last is not the last")
	}
}

// BenchmarkReviewQueue200k times the queue page over 200,000 pending items with 100,000
// distinct question names, the index built by the stream reader's own decoding, and reports
// the page process's heap (heap-MiB: in use after a GC, index and all; heap-after-MiB: in use
// after the pages, garbage included) and the page's size.
// 6-reviewers is six reviewers loading the page at once (ns/op per round of six). Figures:
// deploy/performance.md, "The review page under a hostile queue".
func BenchmarkReviewQueue200k(b *testing.B) {
	s := scaleServer(b, scaleItems, scaleDistinct, true)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap := float64(ms.HeapInuse) / (1 << 20)
	b.Run("one", func(b *testing.B) {
		var size int
		for b.Loop() {
			size = s.serveQueue("/").Body.Len()
		}
		runtime.ReadMemStats(&ms)
		b.ReportMetric(heap, "heap-MiB")
		b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-after-MiB")
		b.ReportMetric(float64(size), "page-bytes")
	})
	b.Run("sorted-by-confidence", func(b *testing.B) {
		for b.Loop() {
			s.serveQueue("/?sort=confidence")
		}
	})
	b.Run("search", func(b *testing.B) {
		for b.Loop() {
			s.serveQueue("/?search=question-0987")
		}
	})
	b.Run("6-reviewers", func(b *testing.B) {
		for b.Loop() {
			var wg sync.WaitGroup
			for range 6 {
				wg.Go(func() { s.serveQueue("/") })
			}
			wg.Wait()
		}
		runtime.ReadMemStats(&ms)
		b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
	})
}
