package batch

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// ProgressWriter draws a run's progress: a bar redrawn in place on a terminal (live), or a
// plain line every Every otherwise (logs, CI, pipes).
//
// It is a few dozen lines rather than a progress-bar library on purpose: the line shows four
// counters, a rate and an ETA this package computes anyway, the rendering is a pure function
// of the snapshot and the clock (tested byte for byte), and the repository's other live line
// (sys1 bench) is drawn the same way (\r and erase-line).
type ProgressWriter struct {
	W     io.Writer
	Live  bool
	Width int           // terminal columns; 0 means 100
	Every time.Duration // plain mode: one line per Every (default 10s)
	Label string        // e.g. the batch id

	lastPlain time.Duration
	printed   bool
	samples   []sample // for the rate: (elapsed, done) over the last rateWindow
	drawn     bool
}

type sample struct {
	at   time.Duration
	done int
}

const rateWindow = 10 * time.Second

// Update draws p (live) or prints it when a plain line is due; Final snapshots always print.
func (w *ProgressWriter) Update(p Progress) {
	sent := p.Succeeded + p.Failed + p.Cancelled // the items a worker answered
	w.samples = append(w.samples, sample{p.Elapsed, sent})
	for len(w.samples) > 2 && p.Elapsed-w.samples[0].at > rateWindow {
		w.samples = w.samples[1:]
	}
	// The rate over the last rateWindow, or since the start when that is all there is (the
	// first plain line) and at the end.
	rate := 0.0
	if first := w.samples[0]; len(w.samples) > 1 && p.Elapsed > first.at && !p.Final {
		rate = float64(sent-first.done) / (p.Elapsed - first.at).Seconds()
	} else if p.Elapsed > 0 {
		rate = float64(sent) / p.Elapsed.Seconds()
	}
	if w.Live {
		line := w.render(p, rate)
		if p.Final {
			fmt.Fprintf(w.W, "\r\033[K%s\n", line)
		} else {
			fmt.Fprintf(w.W, "\r\033[K%s", line)
		}
		w.drawn = !p.Final
		return
	}
	every := w.Every
	if every <= 0 {
		every = 10 * time.Second
	}
	if w.printed && !p.Final && p.Elapsed-w.lastPlain < every {
		return
	}
	w.printed, w.lastPlain = true, p.Elapsed
	fmt.Fprintln(w.W, w.plain(p, rate))
}

// Clear erases a live line before other output (a warning) is written.
func (w *ProgressWriter) Clear() {
	if w.Live && w.drawn {
		fmt.Fprint(w.W, "\r\033[K")
	}
}

func (w *ProgressWriter) counts(p Progress) string {
	s := fmt.Sprintf("ok %d  failed %d  invalid %d", p.Succeeded, p.Failed, p.Invalid)
	if p.Cancelled > 0 {
		s += fmt.Sprintf("  cancelled %d", p.Cancelled)
	}
	return s
}

func eta(p Progress, rate float64) string {
	left := p.Total - p.Done()
	switch {
	case left == 0:
		return "done"
	case rate <= 0:
		return "ETA -"
	}
	return "ETA " + time.Duration(float64(left)/rate*float64(time.Second)).Round(time.Second).String()
}

func (w *ProgressWriter) render(p Progress, rate float64) string {
	width := w.Width
	if width <= 0 {
		width = 100
	}
	pct := 0.0
	if p.Total > 0 {
		pct = float64(p.Done()) / float64(p.Total)
	}
	text := fmt.Sprintf(" %d/%d %3.0f%%  %s  %.0f/s  %s", p.Done(), p.Total, 100*pct, w.counts(p), rate, eta(p, rate))
	// The bar's width depends on the terminal only, so it does not jitter as the figures grow.
	barWidth := min(40, width-62)
	if barWidth < 10 {
		// Too narrow for a bar: the figures alone, cut to the width.
		return cut(strings.TrimSpace(text), width-1)
	}
	filled := int(pct * float64(barWidth))
	bar := "[" + strings.Repeat("=", filled) + strings.Repeat(" ", barWidth-filled) + "]"
	return cut(bar+text, width-1)
}

func (w *ProgressWriter) plain(p Progress, rate float64) string {
	label := "batch"
	if w.Label != "" {
		label = "batch " + w.Label
	}
	return fmt.Sprintf("%s: %d/%d done (%s), %d in flight, %.1f/s, %s, %s elapsed",
		label, p.Done(), p.Total, strings.ReplaceAll(w.counts(p), "  ", ", "), p.Outstanding, rate, eta(p, rate), p.Elapsed.Round(time.Second))
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:max(n, 0)]
}
