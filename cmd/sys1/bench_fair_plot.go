package main

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"os"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

var (
	fairColour    = color.NRGBA{R: 0x1f, G: 0x6f, B: 0xc8, A: 0xff}
	arrivalColour = color.NRGBA{R: 0xc8, G: 0x3a, B: 0x2a, A: 0xff}
)

// writeFairPlot draws b's p99 (solid) and p50 (dashed) against a's flood, fair share and
// arrival order, on log scales, each mode's b alone as a dotted level; a percentile past the
// cap is drawn at the cap with an upward triangle.
func writeFairPlot(w io.Writer, rep *fairReport) error {
	if len(rep.Floods) == 0 {
		return errors.New("no flood measured (--fair-parts without floods)")
	}
	s := rep.Setup
	p := gplot.New()
	p.Title.Text = fmt.Sprintf("caller b's latency beside caller a's flood (b: %d requests a round, %d rounds; 1 worker × %d slots, a %s model)",
		s.B, s.Rounds, s.Concurrency, fmtDurMS(s.ProviderLatencyMS))
	p.X.Label.Text = fmt.Sprintf("a's flood, × b's load (a's requests = flood × %d)", s.B)
	p.Y.Label.Text = "b's latency, publish to reply (ms)"
	p.X.Scale, p.Y.Scale = gplot.LogScale{}, gplot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = gplot.LogTicks{Prec: -1}, gplot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())

	var capped *plotter.Scatter // the legend's entry for percentiles past the cap
	minFlood, maxFlood := 0, 0
	for _, c := range rep.Floods {
		if c.Flood > 0 && (minFlood == 0 || c.Flood < minFlood) {
			minFlood = c.Flood
		}
		maxFlood = max(maxFlood, c.Flood)
	}
	// Room around the floods, and above the highest point for the legend.
	left, right := float64(minFlood)/2, float64(maxFlood)*2
	p.X.Min, p.X.Max = left, right
	top := 0.0
	for _, c := range rep.Floods {
		top = max(top, c.MaxMS, c.P99MS)
	}
	p.Y.Max = top * 8
	for _, fair := range []bool{true, false} {
		colour := arrivalColour
		if fair {
			colour = fairColour
		}
		for _, q := range []struct {
			name   string
			value  func(fairFloodCell) (float64, bool)
			dashes []vg.Length
		}{
			{"p99", func(c fairFloodCell) (float64, bool) { return c.P99MS, c.P99Over }, nil},
			{"p50", func(c fairFloodCell) (float64, bool) { return c.P50MS, c.P50Over }, []vg.Length{vg.Points(5), vg.Points(3)}},
		} {
			var pts, over plotter.XYs
			var alone float64
			for _, c := range rep.Floods {
				if c.FairShare != fair {
					continue
				}
				v, capped := q.value(c)
				if c.Flood == 0 {
					alone = v
					continue
				}
				if v <= 0 {
					continue
				}
				pts = append(pts, plotter.XY{X: float64(c.Flood), Y: v})
				if capped {
					over = append(over, plotter.XY{X: float64(c.Flood), Y: v})
				}
			}
			if len(pts) > 0 {
				line, dots, err := plotter.NewLinePoints(pts)
				if err != nil {
					return err
				}
				line.Color, line.Width, line.Dashes = colour, vg.Points(2), q.dashes
				dots.Color, dots.Shape = colour, draw.CircleGlyph{}
				p.Add(line, dots)
				p.Legend.Add(fmt.Sprintf("%s, %s", modeName(fair), q.name), line)
			}
			if len(over) > 0 {
				up, err := plotter.NewScatter(over)
				if err != nil {
					return err
				}
				up.Color, up.Shape, up.Radius = colour, draw.TriangleGlyph{}, vg.Points(6)
				p.Add(up)
				capped = up
			}
			if alone > 0 && minFlood > 0 {
				level, err := plotter.NewLine(plotter.XYs{{X: left, Y: alone}, {X: right, Y: alone}})
				if err != nil {
					return err
				}
				level.Color, level.Width, level.Dashes = colour, vg.Points(1), []vg.Length{vg.Points(1), vg.Points(3)}
				p.Add(level)
				if q.name == "p99" {
					p.Legend.Add(fmt.Sprintf("%s, b alone (dotted: p99, p50)", modeName(fair)), level)
				}
			}
		}
	}
	if capped != nil {
		p.Legend.Add(fmt.Sprintf("still unanswered at the %s cap", fmtDurMS(s.CapMS)), capped)
	}
	wt, err := p.WriterTo(10*vg.Inch, 6*vg.Inch, "png")
	if err != nil {
		return err
	}
	_, err = wt.WriteTo(w)
	return err
}

func saveFairPlot(path string, rep *fairReport) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := writeFairPlot(f, rep); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
