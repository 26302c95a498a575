// Package harness is a fake GPU node: it embeds the kubelet's real device manager
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager), registers a Node, keeps the
// Node's extended resources in step with the device plugins, admits the pods bound
// to the node through the device manager (Allocate, GetDeviceRunContainerOptions),
// marks them Running and serves the PodResources API from the same manager.
package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// Config describes one fake node.
type Config struct {
	NodeName           string
	PluginDir          string // kubelet.sock and the device manager checkpoint live here
	PodResourcesSocket string // empty: do not serve the PodResources API
	StateDir           string // allocations/<namespace>_<pod>.json
	CPU                resource.Quantity
	Memory             resource.Quantity
	Pods               int64
	Labels             map[string]string // extra node labels (set on registration)

	HeartbeatInterval time.Duration // node Ready heartbeat + Lease renewal (default 10s)
	CapacityInterval  time.Duration // device manager capacity poll (default 1s)
}

// Harness is one running fake node.
type Harness struct {
	cfg      Config
	client   kubernetes.Interface
	logger   klog.Logger
	mgr      *devicemanager.ManagerImpl
	factory  informers.SharedInformerFactory
	pods     cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
	bcast    record.EventBroadcaster

	mu       sync.Mutex
	handled  map[types.UID]bool // admitted (Running) or rejected: never admitted twice
	rejected map[types.UID]bool // rejected pods are not active, so their devices are freed
	ext      map[v1.ResourceName]extResource
	nodeUID  types.UID
	ready    chan struct{} // closed once the harness serves everything
}

type extResource struct{ capacity, allocatable int64 }

// New prepares a harness; Run starts it.
func New(cfg Config, client kubernetes.Interface, logger klog.Logger) *Harness {
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = 10 * time.Second
	}
	if cfg.CapacityInterval == 0 {
		cfg.CapacityInterval = time.Second
	}
	if cfg.Pods == 0 {
		cfg.Pods = 110
	}
	return &Harness{
		cfg:      cfg,
		client:   client,
		logger:   logger.WithValues("node", cfg.NodeName),
		handled:  map[types.UID]bool{},
		rejected: map[types.UID]bool{},
		ext:      map[v1.ResourceName]extResource{},
		ready:    make(chan struct{}),
	}
}

// Ready is closed once the registration socket, the node and the pod informer are up.
func (h *Harness) Ready() <-chan struct{} { return h.ready }

// Manager exposes the embedded device manager (for tests).
func (h *Harness) Manager() *devicemanager.ManagerImpl { return h.mgr }

// AllocationsDir is where allocation records are written.
func (h *Harness) AllocationsDir() string { return filepath.Join(h.cfg.StateDir, "allocations") }

// Run serves until ctx is cancelled, then stops the device manager (removing
// kubelet.sock) and the PodResources server (removing its socket).
func (h *Harness) Run(ctx context.Context) error {
	cfg := h.cfg
	for _, d := range []string{cfg.PluginDir, h.AllocationsDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}

	mgr, err := NewDeviceManager(h.logger, cfg.PluginDir)
	if err != nil {
		return err
	}
	h.mgr = mgr

	h.factory = informers.NewSharedInformerFactoryWithOptions(h.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
		}))
	h.pods = h.factory.Core().V1().Pods().Informer()
	h.queue = workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	enqueue := func(obj interface{}) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			h.queue.Add(key)
		}
	}
	if _, err := h.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj interface{}) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		return err
	}

	h.bcast = record.NewBroadcaster(record.WithContext(ctx))
	h.bcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: h.client.CoreV1().Events("")})
	h.recorder = h.bcast.NewRecorder(scheme.Scheme, v1.EventSource{Component: "kubelet", Host: cfg.NodeName})
	defer h.bcast.Shutdown()

	// Like a kubelet start: Start removes every socket in the plugin directory
	// (CleanupPluginDirectory), reads the checkpoint, then serves kubelet.sock.
	if err := mgr.Start(h.logger, h.activePods, sourcesReady{h.pods.HasSynced},
		containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return fmt.Errorf("starting device manager: %w", err)
	}
	h.logger.Info("device plugin registration server started", "socket", filepath.Join(cfg.PluginDir, "kubelet.sock"))
	defer func() {
		if err := mgr.Stop(h.logger); err != nil {
			h.logger.Error(err, "stopping device manager")
		}
		h.logger.Info("device manager stopped")
	}()

	if err := h.registerNode(ctx); err != nil {
		return err
	}

	h.factory.Start(ctx.Done())
	defer h.factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), h.pods.HasSynced) {
		return ctx.Err()
	}

	h.pruneAllocationRecords()

	if cfg.PodResourcesSocket != "" {
		stop, err := h.servePodResources(ctx, cfg.PodResourcesSocket)
		if err != nil {
			return err
		}
		defer stop()
	}

	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); h.heartbeatLoop(ctx) }()
	go func() { defer wg.Done(); h.capacityLoop(ctx) }()
	go func() { defer wg.Done(); h.podWorker(ctx) }()
	close(h.ready)
	h.logger.Info("harness ready")

	<-ctx.Done()
	h.queue.ShutDown()
	wg.Wait()
	h.logger.Info("harness shutting down")
	return nil
}

// pruneAllocationRecords removes the records of pods deleted while the harness was down.
func (h *Harness) pruneAllocationRecords() {
	files, _ := filepath.Glob(filepath.Join(h.AllocationsDir(), "*_*.json"))
	for _, f := range files {
		var rec AllocationRecord
		data, err := os.ReadFile(f)
		if err == nil {
			err = json.Unmarshal(data, &rec)
		}
		if err == nil {
			obj, ok, _ := h.pods.GetIndexer().GetByKey(rec.Namespace + "/" + rec.Name)
			if ok && obj.(*v1.Pod).UID == types.UID(rec.UID) {
				continue
			}
		}
		if os.Remove(f) == nil {
			h.logger.Info("removed allocation record of a pod that is gone", "file", f)
		}
	}
}

// activePods is the device manager's ActivePodsFunc: the pods bound to this node
// that are not terminal and were not rejected (as the kubelet's GetActivePods).
func (h *Harness) activePods() []*v1.Pod {
	var out []*v1.Pod
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, obj := range h.pods.GetStore().List() {
		pod := obj.(*v1.Pod)
		if pod.Spec.NodeName != h.cfg.NodeName || isTerminal(pod) || h.rejected[pod.UID] {
			continue
		}
		out = append(out, pod)
	}
	return out
}

func (h *Harness) allPods() []*v1.Pod {
	var out []*v1.Pod
	for _, obj := range h.pods.GetStore().List() {
		if pod := obj.(*v1.Pod); pod.Spec.NodeName == h.cfg.NodeName {
			out = append(out, pod)
		}
	}
	return out
}

func isTerminal(pod *v1.Pod) bool {
	return pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
}

// sourcesReady tells the device manager when the pod source (the informer) has synced,
// after which it may free devices of pods that are gone.
type sourcesReady struct{ synced func() bool }

func (s sourcesReady) AddSource(string) {}
func (s sourcesReady) AllReady() bool   { return s.synced() }
