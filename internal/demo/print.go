package demo

import (
	"fmt"
	"io"
)

// ANSI colours, used only when the output is a terminal.
const (
	bold   = "\x1b[1m"
	red    = "\x1b[31m"
	green  = "\x1b[32m"
	yellow = "\x1b[33m"
	cyan   = "\x1b[36m"
	reset  = "\x1b[0m"
)

// printer writes the demo's steps and indented lines.
type printer struct {
	w     io.Writer
	color bool
}

// paint wraps s in the colour codes, or returns it as it is.
func (p *printer) paint(codes, s string) string {
	if !p.color {
		return s
	}
	return codes + s + reset
}

// step starts a section: "==> what".
func (p *printer) step(format string, args ...any) {
	fmt.Fprintf(p.w, "\n%s\n", p.paint(bold+cyan, "==> "+fmt.Sprintf(format, args...)))
}

// say prints one indented line of a section.
func (p *printer) say(format string, args ...any) {
	fmt.Fprintf(p.w, "    %s\n", fmt.Sprintf(format, args...))
}

// verdict prints the demo's last line.
func (p *printer) verdict(color, text string) {
	fmt.Fprintf(p.w, "\n%s\n", p.paint(bold+color, "demo: "+text))
}
