package harness

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"gpuops.local/tests/k8s/harness/internal/testplugin"
)

const gpu = v1.ResourceName("nvidia.com/gpu")

type env struct {
	t        *testing.T
	client   kubernetes.Interface
	cfg      Config
	plugin   *testplugin.Plugin
	stopNode func()
}

func startHarness(t *testing.T, e *env) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := New(e.cfg, e.client, klog.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	select {
	case <-h.Ready():
	case err := <-done:
		t.Fatalf("harness exited: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("harness not ready")
	}
	e.stopNode = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("harness: %v", err)
		}
	}
}

func newEnv(t *testing.T) *env { return newEnvOrdered(t, false) }

func newEnvOrdered(t *testing.T, pluginFirst bool) *env {
	dir, err := os.MkdirTemp("", "gh") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &env{t: t, client: fake.NewClientset(), cfg: Config{
		NodeName:           "gpu-node-1",
		PluginDir:          filepath.Join(dir, "dp"),
		PodResourcesSocket: filepath.Join(dir, "pr.sock"),
		StateDir:           filepath.Join(dir, "state"),
		CPU:                resource.MustParse("64"),
		Memory:             resource.MustParse("256Gi"),
		Pods:               110,
		HeartbeatInterval:  200 * time.Millisecond,
		CapacityInterval:   100 * time.Millisecond,
	}}
	if !pluginFirst {
		startHarness(t, e)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.plugin = testplugin.New(testplugin.Config{PluginDir: e.cfg.PluginDir, Resource: string(gpu), Count: 2,
		PreStartRequired: true, CDIKind: "nvidia.com/gpu", Logger: log.New(io.Discard, "", 0)})
	pdone := make(chan error, 1)
	go func() { pdone <- e.plugin.Run(ctx) }()
	if pluginFirst {
		time.Sleep(200 * time.Millisecond) // the plugin is up and waiting for kubelet.sock
		startHarness(t, e)
	}
	t.Cleanup(func() {
		if e.stopNode != nil {
			e.stopNode()
		}
		cancel()
		<-pdone
	})
	return e
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *env) gpus() (capacity, allocatable int64) {
	n, err := e.client.CoreV1().Nodes().Get(context.Background(), e.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return -1, -1
	}
	c, a := n.Status.Capacity[gpu], n.Status.Allocatable[gpu]
	return c.Value(), a.Value()
}

func (e *env) waitGPUs(capacity, allocatable int64) {
	e.t.Helper()
	eventually(e.t, "node gpu capacity", func() bool {
		c, a := e.gpus()
		return c == capacity && a == allocatable
	})
}

func (e *env) createPod(name string, gpus int64) {
	e.t.Helper()
	q := *resource.NewQuantity(gpus, resource.DecimalSI)
	_, err := e.client.CoreV1().Pods("default").Create(context.Background(), &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)}, // the fake clientset assigns no UIDs,
		Spec: v1.PodSpec{NodeName: e.cfg.NodeName, Containers: []v1.Container{{Name: "main", Image: "busybox",
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{gpu: q}, Requests: v1.ResourceList{gpu: q}}}}},
		Status: v1.PodStatus{Phase: v1.PodPending},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) waitPhase(name string, phase v1.PodPhase) *v1.Pod {
	e.t.Helper()
	var pod *v1.Pod
	eventually(e.t, "pod "+name+" "+string(phase), func() bool {
		p, err := e.client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		pod = p
		return err == nil && p.Status.Phase == phase
	})
	return pod
}

func (e *env) record(name string) AllocationRecord {
	e.t.Helper()
	data, err := os.ReadFile(AllocationFile(e.cfg.StateDir, "default", name))
	if err != nil {
		e.t.Fatal(err)
	}
	var r AllocationRecord
	if err := json.Unmarshal(data, &r); err != nil {
		e.t.Fatal(err)
	}
	return r
}

func (e *env) podResources() *podresourcesv1.ListPodResourcesResponse {
	e.t.Helper()
	conn, err := grpc.NewClient("unix://"+e.cfg.PodResourcesSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	resp, err := podresourcesv1.NewPodResourcesListerClient(conn).List(context.Background(), &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

func TestHarnessPodLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.waitGPUs(2, 2)

	n, _ := e.client.CoreV1().Nodes().Get(ctx, e.cfg.NodeName, metav1.GetOptions{})
	if n.Labels[LabelHarness] != "true" || n.Labels[v1.LabelHostname] != e.cfg.NodeName {
		t.Errorf("labels %v", n.Labels)
	}
	if c := n.Status.Conditions; len(c) == 0 || c[len(c)-1].Type != v1.NodeReady || c[len(c)-1].Status != v1.ConditionTrue {
		t.Errorf("conditions %v", c)
	}
	if _, err := e.client.CoordinationV1().Leases("kube-node-lease").Get(ctx, e.cfg.NodeName, metav1.GetOptions{}); err != nil {
		t.Errorf("lease: %v", err)
	}

	// One GPU: admitted through Allocate, recorded, Running.
	e.createPod("one", 1)
	pod := e.waitPhase("one", v1.PodRunning)
	if len(pod.Status.ContainerStatuses) != 1 || pod.Status.ContainerStatuses[0].State.Running == nil {
		t.Errorf("container statuses %+v", pod.Status.ContainerStatuses)
	}
	r := e.record("one")
	if r.UID != string(pod.UID) || len(r.Containers) != 1 {
		t.Fatalf("record %+v", r)
	}
	ids := r.Containers[0].Devices[string(gpu)]
	if len(ids) != 1 || ids[0] != "GPU-fake-0" { // the plugin's preferred allocation: lowest ID
		t.Errorf("devices %v", r.Containers[0].Devices)
	}
	if got := r.Containers[0].Envs["NVIDIA_VISIBLE_DEVICES"]; got != ids[0] {
		t.Errorf("env NVIDIA_VISIBLE_DEVICES=%q, want %q", got, ids[0])
	}
	if got := r.Containers[0].CDIDevices; len(got) != 1 || got[0] != "nvidia.com/gpu="+ids[0] {
		t.Errorf("cdi devices %v", got)
	}

	// PodResources from the same device manager.
	var found bool
	for _, pr := range e.podResources().PodResources {
		if pr.Name != "one" {
			continue
		}
		for _, c := range pr.Containers {
			for _, d := range c.Devices {
				found = found || (d.ResourceName == string(gpu) && len(d.DeviceIds) == 1 && d.DeviceIds[0] == ids[0])
			}
		}
	}
	if !found {
		t.Errorf("PodResources List does not show %s for pod one: %v", ids[0], e.podResources())
	}

	// Two GPUs with one left: rejected like the kubelet does.
	e.createPod("two", 2)
	pod = e.waitPhase("two", v1.PodFailed)
	if pod.Status.Reason != "UnexpectedAdmissionError" {
		t.Errorf("reason %q message %q", pod.Status.Reason, pod.Status.Message)
	}
	t.Logf("rejection message: %s", pod.Status.Message)

	// Deleting pod one frees its device: a two-GPU pod now fits.
	if err := e.client.CoreV1().Pods("default").Delete(ctx, "one", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "allocation record removed", func() bool {
		_, err := os.Stat(AllocationFile(e.cfg.StateDir, "default", "one"))
		return os.IsNotExist(err)
	})
	e.createPod("three", 2)
	e.waitPhase("three", v1.PodRunning)
	if got := e.record("three").Containers[0].Envs["NVIDIA_VISIBLE_DEVICES"]; got != "GPU-fake-0,GPU-fake-1" {
		t.Errorf("pod three env %q", got)
	}

	// Health: device 0 unhealthy -> allocatable 1 of capacity 2.
	e.plugin.ToggleHealth(0)
	e.waitGPUs(2, 1)
	e.plugin.ToggleHealth(0)
	e.waitGPUs(2, 2)
}

func TestHarnessRestartReregisters(t *testing.T) {
	e := newEnv(t)
	e.waitGPUs(2, 2)
	e.createPod("keep", 1)
	e.waitPhase("keep", v1.PodRunning)
	eventually(t, "first registration", func() bool { return e.plugin.Registrations() == 1 })

	// Restart the node: the new device manager wipes the sockets and serves a new
	// kubelet.sock; the plugin must notice and register again.
	e.stopNode()
	if _, err := os.Stat(filepath.Join(e.cfg.PluginDir, "kubelet.sock")); !os.IsNotExist(err) {
		t.Errorf("kubelet.sock not removed on shutdown: %v", err)
	}
	if _, err := os.Stat(e.cfg.PodResourcesSocket); !os.IsNotExist(err) {
		t.Errorf("podresources socket not removed on shutdown: %v", err)
	}
	ghost := AllocationFile(e.cfg.StateDir, "default", "ghost") // a pod deleted while the node was down
	if err := writeJSONAtomic(ghost, AllocationRecord{Namespace: "default", Name: "ghost", UID: "gone"}); err != nil {
		t.Fatal(err)
	}
	startHarness(t, e)
	if _, err := os.Stat(ghost); !os.IsNotExist(err) {
		t.Errorf("stale allocation record kept: %v", err)
	}
	if _, err := os.Stat(AllocationFile(e.cfg.StateDir, "default", "keep")); err != nil {
		t.Errorf("record of the running pod lost: %v", err)
	}
	eventually(t, "re-registration", func() bool { return e.plugin.Registrations() == 2 })
	e.waitGPUs(2, 2)

	// The running pod keeps its checkpointed device: only one is free.
	e.createPod("after", 2)
	if p := e.waitPhase("after", v1.PodFailed); p.Status.Reason != "UnexpectedAdmissionError" {
		t.Errorf("reason %q", p.Status.Reason)
	}
	e.createPod("after1", 1)
	e.waitPhase("after1", v1.PodRunning)
	a, b := e.record("keep").Containers[0].Devices[string(gpu)], e.record("after1").Containers[0].Devices[string(gpu)]
	if len(a) != 1 || len(b) != 1 || a[0] == b[0] {
		t.Errorf("devices keep=%v after1=%v", a, b)
	}
}

func TestPluginStartedBeforeHarness(t *testing.T) {
	e := newEnvOrdered(t, true)
	e.waitGPUs(2, 2)
	if n := e.plugin.Registrations(); n != 1 {
		t.Errorf("registrations %d", n)
	}
}
