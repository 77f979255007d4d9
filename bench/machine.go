package bench

import (
	"bufio"
	"os"
	"runtime"
	"strings"
)

// cpuModel returns the CPU's model name from /proc/cpuinfo, or the
// architecture where there is none.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// x86: "model name"; some arm64 kernels: "Model" or "CPU part".
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name", "Model", "Hardware":
			if v = strings.TrimSpace(v); v != "" {
				return v
			}
		}
	}
	return runtime.GOARCH
}
