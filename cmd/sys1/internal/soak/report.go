package soak

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Print writes the soak's verdict: the figures, each check with what it looked at, and every
// violation with its runs and the fault timeline around it.
func (r *Result) Print(w io.Writer) {
	o := r.Observations
	fmt.Fprintf(w, "\nsys1 soak: seed %d, %s from the first fault-free start to the end of the checks\n", r.Plan.Seed, o.End.Sub(o.Start).Round(time.Second))
	fmt.Fprintf(w, "load: %s\n", r.Stats)
	var kinds []string
	total := 0
	for k, n := range r.Stats.Faults {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
		total += n
	}
	sort.Strings(kinds)
	fmt.Fprintf(w, "faults injected: %d (%s)\n", total, strings.Join(kinds, ", "))
	if r.Drained {
		fmt.Fprintf(w, "drained in %s after the load\n", r.DrainTook.Round(100*time.Millisecond))
	} else {
		fmt.Fprintf(w, "NOT drained: the fleet still had work %s after the load\n", r.DrainTook.Round(time.Second))
	}
	fmt.Fprintln(w, "checks:")
	for _, res := range r.Report.Results {
		mark := "ok  "
		if len(res.Violations) > 0 {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s %s (%d checked", mark, res.Check, res.Checked)
		if len(res.Violations) > 0 {
			fmt.Fprintf(w, ", %d violations", len(res.Violations))
		}
		fmt.Fprintln(w, ")")
		for _, n := range res.Notes {
			fmt.Fprintf(w, "       note: %s\n", n)
		}
	}
	vs := r.Report.Violations()
	if len(vs) == 0 {
		fmt.Fprintln(w, "violations: 0")
		return
	}
	fmt.Fprintf(w, "violations: %d\n", len(vs))
	for i, v := range vs {
		if i == 30 {
			fmt.Fprintf(w, "… and %d more\n", len(vs)-i)
			break
		}
		fmt.Fprintf(w, "\n[%d] %s\n    %s\n", i+1, v.Check, v.Detail)
		if len(v.RunIDs) > 0 {
			fmt.Fprintf(w, "    runs: %s\n", strings.Join(v.RunIDs, ", "))
		}
		if o.Timeline != nil && !v.From.IsZero() {
			events := o.Timeline.Around(v.From, v.To, 15*time.Second)
			if len(events) > 40 {
				events = events[len(events)-40:]
			}
			if len(events) > 0 {
				fmt.Fprintf(w, "    fault timeline from %s to %s (±15s):\n", offset(o.Start, v.From), offset(o.Start, v.To))
				for _, e := range events {
					fmt.Fprintf(w, "      %s\n", e.String(o.Start))
				}
			}
		}
	}
}

// Summary is the soak's verdict as JSON, for the record (deploy/reliability.md).
type Summary struct {
	Seed       uint64         `json:"seed"`
	Started    time.Time      `json:"started"`
	Took       string         `json:"took"`
	Drained    bool           `json:"drained"`
	DrainTook  string         `json:"drain_took"`
	Stats      Stats          `json:"stats"`
	Checks     []CheckSummary `json:"checks"`
	Violations int            `json:"violations"`
	Faults     []string       `json:"fault_plan"`
}

// CheckSummary is one check in a Summary.
type CheckSummary struct {
	Check      string   `json:"check"`
	Checked    int      `json:"checked"`
	Violations []string `json:"violations,omitempty"`
	Notes      []string `json:"notes,omitempty"`
}

// JSON is the Summary, indented.
func (r *Result) JSON() ([]byte, error) {
	s := Summary{Seed: r.Plan.Seed, Started: r.Observations.Start, Took: r.Observations.End.Sub(r.Observations.Start).Round(time.Second).String(),
		Drained: r.Drained, DrainTook: r.DrainTook.Round(100 * time.Millisecond).String(), Stats: r.Stats, Violations: len(r.Report.Violations())}
	for _, f := range r.Plan.Faults {
		s.Faults = append(s.Faults, f.String())
	}
	for _, res := range r.Report.Results {
		cs := CheckSummary{Check: res.Check, Checked: res.Checked, Notes: res.Notes}
		for _, v := range res.Violations {
			cs.Violations = append(cs.Violations, v.Detail+" ["+strings.Join(v.RunIDs, ", ")+"]")
		}
		s.Checks = append(s.Checks, cs)
	}
	return json.MarshalIndent(s, "", "  ")
}
