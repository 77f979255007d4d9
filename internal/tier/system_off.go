//go:build !system

package tier

const system = false
