package main

import (
	"bytes"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// One colour per contender, the same in every chart.
var palette = map[string]color.Color{
	rawPG.name:          color.RGBA{R: 0x8c, G: 0x8c, B: 0x8c, A: 0xff},
	watermillPG.name:    color.RGBA{R: 0x4c, G: 0x9b, B: 0xd6, A: 0xff},
	outboxPG.name:       color.RGBA{R: 0xe0, G: 0x7a, B: 0x1f, A: 0xff},
	outboxTransact.name: color.RGBA{R: 0xf2, G: 0xb8, B: 0x6b, A: 0xff},
	outboxLog.name:      color.RGBA{R: 0x2e, G: 0x9e, B: 0x5b, A: 0xff},
	"p50":               color.RGBA{R: 0x4c, G: 0x9b, B: 0xd6, A: 0xff},
	"p99":               color.RGBA{R: 0xe0, G: 0x7a, B: 0x1f, A: 0xff},
}

// writeCharts draws the charts of the scenarios that ran into dir.
func writeCharts(r *report, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	type chart struct {
		name string
		plot *plot.Plot
		err  error
	}
	var charts []chart
	add := func(name string, p *plot.Plot, err error) { charts = append(charts, chart{name, p, err}) }
	if r.Write != nil {
		p, err := writeChart(r.Write)
		add("bench-write.svg", p, err)
	}
	if r.WriteMy != nil {
		p, err := writeChart(r.WriteMy)
		add("bench-write-mariadb.svg", p, err)
	}
	if r.Drain != nil {
		p, err := drainChart(r.Drain)
		add("bench-drain.svg", p, err)
	}
	if r.Latency != nil {
		p, err := latencyChart(r.Latency)
		add("bench-latency.svg", p, err)
	}
	if r.Soak != nil {
		p, err := soakP99Chart(r.Soak)
		add("bench-soak-p99.svg", p, err)
		p, err = soakSizeChart(r.Soak)
		add("bench-soak-size.svg", p, err)
	}
	if r.SoakLog != nil {
		p, err := soakP99Chart(r.SoakLog)
		add("bench-soak-log-p99.svg", p, err)
		p, err = soakSizeChart(r.SoakLog)
		add("bench-soak-log-size.svg", p, err)
	}
	for _, c := range charts {
		if c.err != nil {
			return fmt.Errorf("chart %s: %w", c.name, c.err)
		}
		if err := save(c.plot, filepath.Join(dir, c.name)); err != nil {
			return err
		}
	}
	return nil
}

// newPlot starts a chart in Liberation Sans.
func newPlot(title, yLabel string) *plot.Plot {
	plot.DefaultFont.Variant = "Sans"
	p := plot.New()
	p.Title.Text = title
	p.Title.Padding = vg.Points(6)
	p.Y.Label.Text = yLabel
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(8)
	p.Add(plotter.NewGrid())
	return p
}

// save writes the chart as SVG. The text is laid out with Liberation Sans's
// metrics, which Arial and Helvetica share, so those stand in for it where it is
// not installed (embedding it would cost half a megabyte per chart).
func save(p *plot.Plot, path string) error {
	canvas := vgsvg.New(20*vg.Centimeter, 10*vg.Centimeter)
	p.Draw(draw.New(canvas))
	var buf bytes.Buffer
	if _, err := canvas.WriteTo(&buf); err != nil {
		return err
	}
	svg := bytes.ReplaceAll(buf.Bytes(), []byte("font-family:Liberation Sans;"), []byte("font-family:'Liberation Sans',Arial,Helvetica,sans-serif;"))
	return os.WriteFile(path, svg, 0o644)
}

// bars draws grouped bars: one series per name, one bar per group.
func bars(p *plot.Plot, groups []string, names []string, value func(group int, name string) float64) error {
	// The groups share about 480 points of width, a third of it left between them.
	width := vg.Points(320 / float64(len(names)*len(groups)))
	width = max(vg.Points(5), min(width, vg.Points(22)))
	var top float64
	for i, name := range names {
		vals := make(plotter.Values, len(groups))
		for g := range groups {
			vals[g] = value(g, name)
			top = max(top, vals[g])
		}
		b, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return err
		}
		b.Offset = vg.Length(float64(i)-float64(len(names)-1)/2) * width
		b.LineStyle.Width = 0
		if c, ok := palette[name]; ok {
			b.Color = c
		}
		p.Add(b)
		p.Legend.Add(name, b)
	}
	p.NominalX(groups...)
	p.X.Min, p.X.Max = -0.6, float64(len(groups))-0.4 // room for the outer labels
	// Room above the bars for the legend.
	p.Y.Min = 0
	p.Y.Max = top * (1.25 + 0.1*float64(len(names)))
	return nil
}

func writeChart(w *writeResult) (*plot.Plot, error) {
	p := newPlot("In-transaction write, "+w.DB+" (lower is better)", "× the business transaction alone")
	var groups, names []string
	for _, c := range w.Cases {
		groups = append(groups, fmt.Sprintf("%s\ntarget ≤ %s×", c.Name, strconv.FormatFloat(c.Target, 'f', -1, 64)))
	}
	for _, n := range w.Contenders {
		if n != business.name {
			names = append(names, n)
		}
	}
	err := bars(p, groups, names, func(g int, name string) float64 { return median(w.Ratio[wkey(w.Cases[g], name)]) })
	return p, err
}

func drainChart(d *drainResult) (*plot.Plot, error) {
	p := newPlot("Drain rate (higher is better)", "messages per second")
	var groups []string
	for _, c := range d.Configs {
		g := fmt.Sprintf("%s, b%d\n%d relay%s", kilo(float64(c.Backlog)), c.Batch, c.Relays, plural(c.Relays))
		if c.Stopped {
			g += ", cold"
		}
		groups = append(groups, g)
	}
	err := bars(p, groups, d.Contenders, func(g int, name string) float64 { return median(d.Rate[dkey(d.Configs[g], name)]) })
	return p, err
}

func latencyChart(l *latencyResult) (*plot.Plot, error) {
	p := newPlot(fmt.Sprintf("Commit → consumer at %d msg/s (lower is better; target p99 ≤ 5 ms)", l.Rate), "milliseconds")
	var groups []string
	type point struct {
		batch int
		name  string
	}
	var points []point
	for _, batch := range l.Batches {
		for _, c := range l.Contenders {
			groups = append(groups, fmt.Sprintf("%s\nbatch %d", c, batch))
			points = append(points, point{batch, c})
		}
	}
	err := bars(p, groups, []string{"p50", "p99"}, func(g int, q string) float64 {
		var xs []float64
		for _, s := range l.Stats[lkey(points[g].batch, points[g].name)] {
			if q == "p50" {
				xs = append(xs, ms(s.P50))
			} else {
				xs = append(xs, ms(s.P99))
			}
		}
		return median(xs)
	})
	return p, err
}

func soakLine(p *plot.Plot, name string, c color.Color, y func(w soakWindow) float64, windows []soakWindow, window time.Duration) error {
	xys := make(plotter.XYs, len(windows))
	unit, _ := windowUnit(window)
	for i, w := range windows {
		xys[i].X = float64(w.Index) * float64(window) / float64(unit)
		xys[i].Y = y(w)
	}
	line, pts, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	line.Color, pts.Color = c, c
	p.Add(line, pts)
	p.Legend.Add(name, line, pts)
	return nil
}

// windowUnit is the soak charts' time axis: minutes, or seconds for a quick run.
func windowUnit(window time.Duration) (time.Duration, string) {
	if window >= time.Minute {
		return time.Minute, "minutes"
	}
	return time.Second, "seconds"
}

func soakP99Chart(s *soakResult) (*plot.Plot, error) {
	p := newPlot(fmt.Sprintf("Soak, %s: p99 commit → consumer per window, %.0f msg/s", s.Contender, s.Achieved), "milliseconds")
	_, p.X.Label.Text = windowUnit(s.Window)
	p.X.Min, p.Y.Min = 0, 0
	err := soakLine(p, "p99", palette["p99"], func(w soakWindow) float64 { return ms(w.P99) }, s.Windows, s.Window)
	if err == nil && len(s.Windows) > 0 {
		err = soakLine(p, "2× the first window", palette[rawPG.name], func(soakWindow) float64 { return 2 * ms(s.Windows[0].P99) }, s.Windows, s.Window)
	}
	p.Y.Max *= 1.3 // room for the legend
	return p, err
}

func soakSizeChart(s *soakResult) (*plot.Plot, error) {
	title := "Soak, %s: outbox table size at the end of each window"
	if s.Logged() {
		title = "Soak, %s: table lane size and slot lag at the end of each window"
	}
	p := newPlot(fmt.Sprintf(title, s.Contender), "MiB")
	_, p.X.Label.Text = windowUnit(s.Window)
	p.X.Min, p.Y.Min = 0, 0
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	err := soakLine(p, "table + indexes", palette[outboxPG.name], func(w soakWindow) float64 { return mib(w.TotalBytes) }, s.Windows, s.Window)
	if err == nil {
		err = soakLine(p, "indexes", palette[watermillPG.name], func(w soakWindow) float64 { return mib(w.IndexBytes) }, s.Windows, s.Window)
	}
	if err == nil && s.Logged() {
		err = soakLine(p, "slot lag", palette[outboxLog.name], func(w soakWindow) float64 { return mib(w.SlotLag) }, s.Windows, s.Window)
	}
	p.Y.Max *= 1.3
	return p, err
}
