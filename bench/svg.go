package main

import (
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The plot: latency percentiles (log scale) on the left, throughput on the
// right, one bar group per scenario. Hand-written SVG, no dependencies.
const (
	svgW, svgH  = 1040, 460
	panelW      = 430
	panelH      = 300
	panelTop    = 90
	leftPanelX  = 70
	rightPanelX = 580
)

var (
	latencyColors    = []string{"#4e79a7", "#59a14f", "#f28e2b", "#e15759"}
	throughputColors = []string{"#76b7b2", "#b07aa1"}
)

func writeSVG(dir string, res *Results) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", svgW, svgH, svgW, svgH)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	m := res.Machine
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="16" font-weight="bold">ztunnel bench: %s</text>`+"\n", leftPanelX, html.EscapeString(strings.Join(res.Config.Scenarios, ", ")))
	fmt.Fprintf(&b, `<text x="%d" y="44" fill="#555">%s, %d cores, %s, %s; %.0fs per measurement; %d rps × %d B</text>`+"\n",
		leftPanelX, html.EscapeString(m.CPUModel), m.Cores, html.EscapeString(m.Kernel), m.GoVersion, res.Config.DurationSeconds, res.Config.RateRPS, res.Config.MessageBytes)

	names := make([]string, len(res.Scenarios))
	lat := make([][]float64, len(res.Scenarios))
	tput := make([][]float64, len(res.Scenarios))
	for i, r := range res.Scenarios {
		names[i] = r.Name
		lat[i] = []float64{r.Latency.P50, r.Latency.P90, r.Latency.P99, r.Latency.P999}
		tput[i] = []float64{r.Throughput1, r.Throughput8}
	}
	barPanel(&b, leftPanelX, "request/response latency, µs (log scale)", names, lat, []string{"p50", "p90", "p99", "p999"}, latencyColors, true)
	barPanel(&b, rightPanelX, "bulk throughput, Gbit/s", names, tput, []string{"1 stream", "8 streams"}, throughputColors, false)
	b.WriteString("</svg>\n")
	p := filepath.Join(dir, "results.svg")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("bench: write plot: %w", err)
	}
	return p, nil
}

// barPanel draws grouped bars: one group per name, one bar per series.
func barPanel(b *strings.Builder, x0 int, title string, names []string, vals [][]float64, series, colors []string, logScale bool) {
	top, bottom := panelTop, panelTop+panelH
	fmt.Fprintf(b, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", x0, top-12, html.EscapeString(title))
	maxV := 0.0
	for _, vs := range vals {
		for _, v := range vs {
			maxV = math.Max(maxV, v)
		}
	}
	// scale maps a value to a height in pixels.
	var scale func(float64) float64
	var ticks []float64
	if logScale {
		lo, hi := 1.0, math.Pow(10, math.Ceil(math.Log10(math.Max(maxV, 10))))
		scale = func(v float64) float64 {
			if v <= lo {
				return 0
			}
			return float64(panelH) * math.Log10(v/lo) / math.Log10(hi/lo)
		}
		for t := lo; t <= hi; t *= 10 {
			ticks = append(ticks, t)
		}
	} else {
		hi := niceCeil(math.Max(maxV, 1))
		scale = func(v float64) float64 { return float64(panelH) * v / hi }
		for i := 0; i <= 5; i++ {
			ticks = append(ticks, hi*float64(i)/5)
		}
	}
	for _, t := range ticks {
		y := float64(bottom) - scale(t)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", x0, y, x0+panelW, y)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end" fill="#555">%s</text>`+"\n", x0-6, y+4, fmtAxis(t))
	}
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", x0, bottom, x0+panelW, bottom)
	if len(names) == 0 {
		return
	}
	groupW := float64(panelW) / float64(len(names))
	barW := groupW * 0.8 / float64(len(series))
	for g, name := range names {
		gx := float64(x0) + groupW*float64(g) + groupW*0.1
		for s, v := range vals[g] {
			h := scale(v)
			x := gx + barW*float64(s)
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s</title></rect>`+"\n",
				x, float64(bottom)-h, barW-1, h, colors[s%len(colors)], html.EscapeString(name), series[s], fmtTick(v))
			// Value labels alternate in height so adjacent ones stay legible.
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="8">%s</text>`+"\n", x+barW/2, float64(bottom)-h-3-9*float64(s%2), fmtTick(v))
		}
		// Long names on alternate rows so neighbours do not overlap.
		ly := bottom + 16 + 13*(g%2)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle" font-size="11">%s</text>`+"\n", gx+groupW*0.4, ly, html.EscapeString(name))
	}
	for s, name := range series {
		lx := x0 + s*90
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/>`+"\n", lx, bottom+40, colors[s%len(colors)])
		fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`+"\n", lx+16, bottom+50, name)
	}
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// fmtAxis formats an axis tick without exponents.
func fmtAxis(v float64) string {
	return strconv.FormatFloat(v, 'f', -1, 64)
}

func fmtTick(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
