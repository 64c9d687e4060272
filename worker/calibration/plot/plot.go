// Package plot draws the reliability diagram of a calibration fit: before and after side by
// side, each a reliability panel (accuracy per confidence bin against the diagonal of perfect
// calibration, the gap shaded) over a panel of how many answers fell in each bin.
package plot

import (
	"bufio"
	"fmt"
	"image/color"
	"io"
	"os"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/sys1hq/sys1/worker/calibration"
)

// The figure's size: readable on a laptop screen and in a pull request.
const (
	width  = 12 * vg.Inch
	height = 7 * vg.Inch
	dpi    = 110
)

var (
	accuracyFill = color.NRGBA{R: 0x3b, G: 0x6e, B: 0xc8, A: 0xe0}
	accuracyLine = color.NRGBA{R: 0x1f, G: 0x3f, B: 0x7a, A: 0xff}
	gapFill      = color.NRGBA{R: 0xe0, G: 0x40, B: 0x40, A: 0x55}
	gapLine      = color.NRGBA{R: 0xc0, G: 0x20, B: 0x20, A: 0xff}
	underFill    = color.NRGBA{R: 0xa8, G: 0xc8, B: 0xf0, A: 0xff}
	countFill    = color.NRGBA{R: 0x90, G: 0x90, B: 0x90, A: 0xff}
	diagonal     = color.NRGBA{R: 0x40, G: 0x40, B: 0x40, A: 0xff}
)

// sparseBin is the count below which a bin is drawn pale.
const sparseBin = 10

// tenths puts ticks at 0, 0.1, …, 1, labelled every 0.2.
var tenths = gplot.TickerFunc(func(_, _ float64) []gplot.Tick {
	var ts []gplot.Tick
	for i := 0; i <= 10; i++ {
		t := gplot.Tick{Value: float64(i) / 10}
		if i%2 == 0 {
			t.Label = fmt.Sprintf("%.1f", t.Value)
		}
		ts = append(ts, t)
	}
	return ts
})

// pale mixes c with white, three quarters white.
func pale(c color.NRGBA) color.NRGBA {
	mix := func(v uint8) uint8 { return uint8((int(v) + 3*255) / 4) }
	return color.NRGBA{R: mix(c.R), G: mix(c.G), B: mix(c.B), A: c.A}
}

// WritePNG writes f's reliability diagram as a PNG to w.
func WritePNG(w io.Writer, f *calibration.Fit) error {
	img := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(dpi))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())

	// Title: what was fitted, from how much, and the verdict in one line.
	titleStyle := gplot.New().Title.TextStyle
	titleStyle.Font.Size = vg.Points(15)
	titleStyle.XAlign, titleStyle.YAlign = draw.XCenter, draw.YTop
	sub := titleStyle
	sub.Font.Size = vg.Points(11)
	mid := (dc.Min.X + dc.Max.X) / 2
	dc.FillText(titleStyle, vg.Point{X: mid, Y: dc.Max.Y - vg.Points(10)},
		fmt.Sprintf("Reliability of %s · caller %s · question %s (%s)", f.Model, f.Caller, f.Question, f.Type))
	status := "converged"
	if !f.Converged {
		status = "NOT converged: " + f.Note
	}
	dc.FillText(sub, vg.Point{X: mid, Y: dc.Max.Y - vg.Points(32)},
		fmt.Sprintf("%d labels, %s to %s · T = %.3f (%s) · ECE %.3f → %.3f", f.N,
			f.Window.FirstLabel.Format("2006-01-02"), f.Window.LastLabel.Format("2006-01-02"),
			f.Temperature, status, f.Before.ECE, f.After.ECE))

	legend(dc, dc.Max.Y-vg.Points(56))
	body := draw.Crop(dc, 0, 0, 0, -vg.Points(76))
	maxCount := 0
	for _, m := range []calibration.Metrics{f.Before, f.After} {
		for _, b := range m.Bins {
			maxCount = max(maxCount, b.Count)
		}
	}
	cols := draw.Tiles{Cols: 2, Rows: 1, PadX: vg.Points(24), PadLeft: vg.Points(8), PadRight: vg.Points(12), PadBottom: vg.Points(6)}
	for i, side := range []struct {
		name string
		m    calibration.Metrics
	}{
		{"Before: the answers as the model sent them", f.Before},
		{fmt.Sprintf("After: calibrated with T = %.3f", f.Temperature), f.After},
	} {
		col := cols.At(body, i, 0)
		rel, err := reliabilityPanel(side.name, side.m)
		if err != nil {
			return err
		}
		counts, err := countPanel(side.m, maxCount)
		if err != nil {
			return err
		}
		// Reliability on top (two thirds), counts below, their x axes aligned.
		h := col.Max.Y - col.Min.Y
		top := draw.Crop(col, 0, 0, h*0.34, 0)
		bottom := draw.Crop(col, 0, 0, 0, -h*0.68)
		top, bottom = alignX(rel, top, counts, bottom)
		rel.Draw(top)
		counts.Draw(bottom)
	}

	bw := bufio.NewWriter(w)
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(bw); err != nil {
		return fmt.Errorf("encode PNG: %w", err)
	}
	return bw.Flush()
}

// SavePNG writes f's reliability diagram to path.
func SavePNG(path string, f *calibration.Fit) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := WritePNG(out, f); err != nil {
		_ = out.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return out.Close()
}

// legend draws one row of swatches and their meaning, centred, its top at y.
func legend(dc draw.Canvas, y vg.Length) {
	sty := gplot.New().Legend.TextStyle
	sty.Font.Size = vg.Points(10)
	sty.XAlign, sty.YAlign = draw.XLeft, draw.YCenter
	type entry struct {
		fill color.Color // nil: the dashed diagonal
		text string
	}
	entries := []entry{
		{nil, "perfect calibration"},
		{accuracyFill, "accuracy per bin"},
		{gapFill, "overconfident: claimed more than achieved"},
		{underFill, "underconfident: achieved more than claimed"},
		{pale(accuracyFill), fmt.Sprintf("pale: under %d answers", sparseBin)},
	}
	swatch, gap := vg.Points(18), vg.Points(16)
	total := vg.Length(0)
	for _, e := range entries {
		total += swatch + vg.Points(5) + sty.Width(e.text) + gap
	}
	x := (dc.Min.X+dc.Max.X)/2 - (total-gap)/2
	half := vg.Points(5)
	for _, e := range entries {
		if e.fill == nil {
			ls := draw.LineStyle{Color: diagonal, Width: vg.Points(1.5), Dashes: []vg.Length{vg.Points(6), vg.Points(4)}}
			dc.StrokeLine2(ls, x, y, x+swatch, y)
		} else {
			r := vg.Rectangle{Min: vg.Point{X: x, Y: y - half}, Max: vg.Point{X: x + swatch, Y: y + half}}
			dc.SetColor(e.fill)
			dc.Fill(r.Path())
			ls := draw.LineStyle{Color: accuracyLine, Width: vg.Points(0.6)}
			dc.StrokeLines(ls, []vg.Point{r.Min, {X: r.Max.X, Y: r.Min.Y}, r.Max, {X: r.Min.X, Y: r.Max.Y}, r.Min})
		}
		x += swatch + vg.Points(5)
		dc.FillText(sty, vg.Point{X: x, Y: y}, e.text)
		x += sty.Width(e.text) + gap
	}
}

// alignX narrows the canvases of two stacked plots so that their data areas span the same
// x range, whatever the widths of their y tick labels.
func alignX(a *gplot.Plot, ac draw.Canvas, b *gplot.Plot, bc draw.Canvas) (draw.Canvas, draw.Canvas) {
	ad, bd := a.DataCanvas(ac), b.DataCanvas(bc)
	left := max(ad.Min.X-ac.Min.X, bd.Min.X-bc.Min.X)
	right := max(ac.Max.X-ad.Max.X, bc.Max.X-bd.Max.X)
	crop := func(c, d draw.Canvas) draw.Canvas {
		return draw.Crop(c, left-(d.Min.X-c.Min.X), (c.Max.X-d.Max.X)-right, 0, 0)
	}
	return crop(ac, ad), crop(bc, bd)
}

func reliabilityPanel(title string, m calibration.Metrics) (*gplot.Plot, error) {
	p := gplot.New()
	p.Title.Text = fmt.Sprintf("%s\nECE %.3f · Brier %.3f · NLL %.3f · accuracy %.1f%%", title, m.ECE, m.Brier, m.NLL, 100*m.Accuracy)
	p.Title.TextStyle.Font.Size = vg.Points(12)
	p.Y.Label.Text = "observed accuracy in the bin"
	p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = 0, 1, 0, 1
	p.X.Tick.Marker, p.Y.Tick.Marker = tenths, tenths
	p.Add(plotter.NewGrid())

	// Each bin's bar rises to its accuracy. Where the model claimed more than it achieved
	// (overconfident) the shortfall up to the mean claimed probability is shaded red above
	// the bar; where it achieved more (underconfident) the bar's part above the claim is
	// light. Bins of fewer than sparseBin answers are pale: their accuracy is mostly noise.
	for _, b := range m.Bins {
		fill, light, red := accuracyFill, underFill, gapFill
		if b.Count < sparseBin {
			fill, light, red = pale(fill), pale(light), pale(red)
		}
		lo, hi := b.Accuracy, b.Confidence
		if b.Accuracy > b.Confidence {
			bar, err := rect(b.Lower, b.Upper, 0, b.Confidence, fill, accuracyLine)
			if err != nil {
				return nil, err
			}
			extra, err := rect(b.Lower, b.Upper, b.Confidence, b.Accuracy, light, accuracyLine)
			if err != nil {
				return nil, err
			}
			p.Add(bar, extra)
			continue
		}
		bar, err := rect(b.Lower, b.Upper, 0, lo, fill, accuracyLine)
		if err != nil {
			return nil, err
		}
		gap, err := rect(b.Lower, b.Upper, lo, hi, red, gapLine)
		if err != nil {
			return nil, err
		}
		p.Add(bar, gap)
	}
	diag, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: 1, Y: 1}})
	if err != nil {
		return nil, err
	}
	diag.Color, diag.Width, diag.Dashes = diagonal, vg.Points(1.5), []vg.Length{vg.Points(6), vg.Points(4)}
	p.Add(diag)
	return p, nil
}

func countPanel(m calibration.Metrics, maxCount int) (*gplot.Plot, error) {
	p := gplot.New()
	p.X.Label.Text = "top-class probability (the model's claimed chance of being right), 15 bins"
	p.Y.Label.Text = "answers"
	p.X.Min, p.X.Max, p.Y.Min = 0, 1, 0
	p.X.Tick.Marker = tenths
	p.Y.Max = float64(max(maxCount, 1)) * 1.25 // room for the count labels
	var labels plotter.XYLabels
	for _, b := range m.Bins {
		r, err := rect(b.Lower, b.Upper, 0, float64(b.Count), countFill, diagonal)
		if err != nil {
			return nil, err
		}
		p.Add(r)
		labels.XYs = append(labels.XYs, plotter.XY{X: (b.Lower + b.Upper) / 2, Y: float64(b.Count)})
		labels.Labels = append(labels.Labels, fmt.Sprint(b.Count))
	}
	if len(labels.XYs) > 0 {
		l, err := plotter.NewLabels(labels)
		if err != nil {
			return nil, err
		}
		for i := range l.TextStyle {
			l.TextStyle[i].Font.Size = vg.Points(9)
			l.TextStyle[i].XAlign = draw.XCenter
		}
		l.Offset = vg.Point{Y: vg.Points(3)}
		p.Add(l)
	}
	return p, nil
}

func rect(x0, x1, y0, y1 float64, fill, line color.Color) (*plotter.Polygon, error) {
	if y1 < y0 {
		y0, y1 = y1, y0
	}
	poly, err := plotter.NewPolygon(plotter.XYs{{X: x0, Y: y0}, {X: x1, Y: y0}, {X: x1, Y: y1}, {X: x0, Y: y1}})
	if err != nil {
		return nil, err
	}
	poly.Color = fill
	poly.LineStyle.Color = line
	poly.LineStyle.Width = vg.Points(0.8)
	return poly, nil
}
