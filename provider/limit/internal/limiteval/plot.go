package main

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
}

// plotTraces draws one panel per trace, stacked: each replica's limit over time and, on the
// same axis, the calls at the server (in service and queued).
func plotTraces(o options, traces []trace) error {
	const width, rowHeight = 11 * vg.Inch, 3.2 * vg.Inch
	img := vgimg.New(width, rowHeight*vg.Length(len(traces)))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(traces), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(6), PadY: vg.Points(10)}
	plots := make([][]*plot.Plot, len(traces))
	for row, tr := range traces {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s: %d replica(s) × max %d, %d-slot server, %s requests", tr.name, tr.replicas, o.max, tr.slots, tr.scenario)
		p.Title.TextStyle.Font.Size = vg.Points(13)
		p.X.Label.Text = "time (s, real-time equivalent)"
		p.Y.Label.Text = "concurrency"
		p.Y.Min = 0
		p.Legend.Top = true
		p.Legend.Left = false
		p.Add(plotter.NewGrid())
		queue, err := line(tr.at, tr.queue, color.Gray{Y: 0x99}, 1.2, true)
		if err != nil {
			return err
		}
		p.Add(queue)
		p.Legend.Add("calls at the server", queue)
		for i, ls := range tr.limits {
			l, err := line(tr.at, ls, palette[i%len(palette)], 2, false)
			if err != nil {
				return err
			}
			p.Add(l)
			p.Legend.Add(fmt.Sprintf("replica %d limit", i+1), l)
		}
		slots, err := line([]float64{tr.at[0], tr.at[len(tr.at)-1]}, []float64{float64(tr.slots), float64(tr.slots)}, color.Black, 1, true)
		if err != nil {
			return err
		}
		p.Add(slots)
		p.Legend.Add("server slots", slots)
		// Head room above the data for the legend.
		top := float64(tr.slots)
		for _, ls := range append(tr.limits, tr.queue) {
			for _, v := range ls {
				top = max(top, v)
			}
		}
		p.Y.Max = top * 1.6
		plots[row] = []*plot.Plot{p}
	}
	canvases := plot.Align(plots, tiles, dc)
	for row := range plots {
		plots[row][0].Draw(canvases[row][0])
	}
	f, err := os.Create(o.out)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func line(xs, ys []float64, c color.Color, width float64, dashed bool) (*plotter.Line, error) {
	pts := make(plotter.XYs, len(xs))
	for i := range xs {
		pts[i].X, pts[i].Y = xs[i], ys[i]
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return nil, err
	}
	l.Color = c
	l.Width = vg.Points(width)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	l.StepStyle = plotter.PostStep
	return l, nil
}
