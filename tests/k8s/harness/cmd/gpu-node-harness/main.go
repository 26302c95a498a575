// gpu-node-harness plays one GPU node for a real control plane: it embeds the
// kubelet's device manager, registers the Node, admits the pods bound to it and
// serves the PodResources API. See ../../README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"gpuops.local/tests/k8s/harness/internal/harness"
)

func main() {
	klog.InitFlags(nil)
	var (
		cfg                harness.Config
		kubeconfig         string
		cpu, memory, label string
		pods               int64
	)
	flag.StringVar(&kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster (default $KUBECONFIG)")
	flag.StringVar(&cfg.NodeName, "node-name", "", "name of the Node to register (required)")
	flag.StringVar(&cfg.PluginDir, "plugin-dir", "", "this node's device-plugins directory; kubelet.sock is served there (required)")
	flag.StringVar(&cfg.PodResourcesSocket, "pod-resources-socket", "", "path of the PodResources API socket to serve (empty: not served)")
	flag.StringVar(&cfg.StateDir, "state-dir", "", "directory for allocations/<namespace>_<pod>.json (required)")
	flag.StringVar(&cpu, "cpu", "64", "node cpu capacity")
	flag.StringVar(&memory, "memory", "256Gi", "node memory capacity")
	flag.Int64Var(&pods, "pods", 110, "node pods capacity")
	flag.StringVar(&label, "node-labels", "", "extra node labels, k=v,k2=v2")
	flag.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", 0, "node status / Lease heartbeat period (default 10s)")
	flag.Parse()

	die := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "gpu-node-harness: "+format+"\n", a...)
		os.Exit(2)
	}
	if cfg.NodeName == "" || cfg.PluginDir == "" || cfg.StateDir == "" || kubeconfig == "" {
		die("--kubeconfig, --node-name, --plugin-dir and --state-dir are required")
	}
	var err error
	if cfg.CPU, err = resource.ParseQuantity(cpu); err != nil {
		die("--cpu: %v", err)
	}
	if cfg.Memory, err = resource.ParseQuantity(memory); err != nil {
		die("--memory: %v", err)
	}
	cfg.Pods = pods
	if label != "" {
		cfg.Labels = map[string]string{}
		for _, kv := range strings.Split(label, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				die("--node-labels: %q is not k=v", kv)
			}
			cfg.Labels[k] = v
		}
	}

	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		die("kubeconfig: %v", err)
	}
	rc.UserAgent = "gpu-node-harness/" + cfg.NodeName
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		die("client: %v", err)
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	logger := klog.Background()
	if err := harness.New(cfg, client, logger).Run(ctx); err != nil {
		logger.Error(err, "harness failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
