package main

import (
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

func save(p *plot.Plot, path string) error {
	canvas := vgsvg.New(18*vg.Centimeter, 9*vg.Centimeter)
	p.Draw(draw.New(canvas))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := canvas.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// bars draws grouped bars: one series per name, one bar per group.
func bars(p *plot.Plot, groups []string, names []string, value func(group int, name string) float64) error {
	width := vg.Points(float64(120 / max(1, len(names)*len(groups)/3+1)))
	width = max(vg.Points(6), min(width, vg.Points(18)))
	for i, name := range names {
		vals := make(plotter.Values, len(groups))
		for g := range groups {
			vals[g] = value(g, name)
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
	p.Legend.Top = true
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	return nil
}

func writeChart(w *writeResult) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "In-transaction write, " + w.DB + " (lower is better)"
	p.Y.Label.Text = "× the business transaction alone"
	var groups, names []string
	for _, c := range w.Cases {
		groups = append(groups, fmt.Sprintf("%s (≤ %s×)", c.Name, strconv.FormatFloat(c.Target, 'f', -1, 64)))
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
	p := plot.New()
	p.Title.Text = "Drain rate (higher is better)"
	p.Y.Label.Text = "messages per second"
	var groups []string
	for _, c := range d.Configs {
		groups = append(groups, fmt.Sprintf("%s b%d ×%d", kilo(float64(c.Backlog)), c.Batch, c.Relays))
	}
	err := bars(p, groups, d.Contenders, func(g int, name string) float64 { return median(d.Rate[dkey(d.Configs[g], name)]) })
	return p, err
}

func latencyChart(l *latencyResult) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Commit → consumer at %d msg/s (lower is better; target p99 ≤ 5 ms)", l.Rate)
	p.Y.Label.Text = "milliseconds"
	var groups []string
	type point struct {
		batch int
		name  string
	}
	var points []point
	for _, batch := range l.Batches {
		for _, c := range l.Contenders {
			groups = append(groups, fmt.Sprintf("%s b%d", c, batch))
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
	for i, w := range windows {
		xys[i].X = float64(w.Index) * window.Minutes()
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

func soakP99Chart(s *soakResult) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Soak: p99 commit → consumer per window, %.0f msg/s", s.Achieved)
	p.X.Label.Text = "minutes"
	p.Y.Label.Text = "milliseconds"
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	err := soakLine(p, "p99", palette["p99"], func(w soakWindow) float64 { return ms(w.P99) }, s.Windows, s.Window)
	if err == nil && len(s.Windows) > 0 {
		err = soakLine(p, "2× the first window", palette[rawPG.name], func(soakWindow) float64 { return 2 * ms(s.Windows[0].P99) }, s.Windows, s.Window)
	}
	p.Legend.Top = true
	return p, err
}

func soakSizeChart(s *soakResult) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Soak: outbox table size at the end of each window"
	p.X.Label.Text = "minutes"
	p.Y.Label.Text = "MiB"
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	err := soakLine(p, "table + indexes", palette[outboxPG.name], func(w soakWindow) float64 { return mib(w.TotalBytes) }, s.Windows, s.Window)
	if err == nil {
		err = soakLine(p, "indexes", palette[watermillPG.name], func(w soakWindow) float64 { return mib(w.IndexBytes) }, s.Windows, s.Window)
	}
	p.Legend.Top = true
	return p, err
}
