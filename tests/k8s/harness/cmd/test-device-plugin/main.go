// test-device-plugin is a tiny device plugin (v1beta1) for exercising a kubelet
// device manager: --count fake devices GPU-fake-0..n-1 of --resource, all Healthy;
// Allocate returns NVIDIA_VISIBLE_DEVICES; re-registers whenever kubelet.sock is
// recreated; SIGUSR1 toggles device 0's health.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"gpuops.local/tests/k8s/harness/internal/testplugin"
)

func main() {
	var cfg testplugin.Config
	flag.StringVar(&cfg.PluginDir, "plugin-dir", "/var/lib/kubelet/device-plugins", "kubelet device-plugins directory (kubelet.sock lives there)")
	flag.StringVar(&cfg.Resource, "resource", "nvidia.com/gpu", "extended resource name")
	flag.IntVar(&cfg.Count, "count", 2, "number of fake devices (IDs GPU-fake-0..count-1)")
	flag.StringVar(&cfg.SocketName, "socket-name", "", "plugin socket file name in --plugin-dir (default derived from --resource, e.g. nvidia-com-gpu.sock)")
	flag.BoolVar(&cfg.PreStartRequired, "pre-start-required", false, "ask the kubelet to call PreStartContainer")
	flag.StringVar(&cfg.CDIKind, "cdi-kind", "", "if set (e.g. nvidia.com/gpu), Allocate also returns CDI devices <kind>=<id>")
	flag.Parse()
	if cfg.Count < 0 || cfg.Resource == "" {
		fmt.Fprintln(os.Stderr, "test-device-plugin: --resource must be set and --count >= 0")
		os.Exit(2)
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	p := testplugin.New(cfg)
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		for range usr1 {
			p.ToggleHealth(0)
		}
	}()
	if err := p.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "test-device-plugin:", err)
		os.Exit(1)
	}
}
