package harness

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

const (
	// LabelHarness marks nodes played by this harness.
	LabelHarness   = "gpuops.dev/harness"
	leaseNamespace = "kube-node-lease"
	leaseDuration  = 40 // seconds, as the kubelet's default nodeLeaseDurationSeconds
)

// kubeVersion is the k8s.io/kubernetes version the device manager came from.
func kubeVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "k8s.io/kubernetes" {
				return d.Version
			}
		}
	}
	return "v0.0.0-unknown"
}

func (h *Harness) nodeLabels() map[string]string {
	l := map[string]string{
		v1.LabelHostname:   h.cfg.NodeName,
		v1.LabelOSStable:   runtime.GOOS,
		v1.LabelArchStable: runtime.GOARCH,
		LabelHarness:       "true",
	}
	maps.Copy(l, h.cfg.Labels)
	return l
}

// registerNode creates the Node (or, as a restarted kubelet does, reuses the
// existing one and merges our labels into it), removes the not-ready taint the
// NodeTaint admission plugin puts on new nodes (normally the node lifecycle
// controller does that once the node is Ready; the test bed may run without
// kube-controller-manager) and posts a Ready status.
func (h *Harness) registerNode(ctx context.Context) error {
	var node *v1.Node
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := h.client.CoreV1().Nodes().Create(ctx, &v1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: h.cfg.NodeName, Labels: h.nodeLabels()},
			Status:     h.nodeStatus(v1.NodeStatus{}, time.Now()),
		}, metav1.CreateOptions{})
		if err == nil {
			h.logger.Info("node registered", "uid", n.UID)
			node = n
			return true, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			h.logger.Error(err, "registering node (will retry)")
			return false, nil
		}
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := h.client.CoreV1().Nodes().Get(ctx, h.cfg.NodeName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			maps.Copy(n.Labels, h.nodeLabels())
			node, err = h.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			h.logger.Error(err, "updating existing node (will retry)")
			return false, nil
		}
		h.logger.Info("node already registered, reusing it", "uid", node.UID)
		return true, nil
	})
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.nodeUID = node.UID
	h.mu.Unlock()
	if err := h.updateNodeStatus(ctx); err != nil {
		h.logger.Error(err, "posting node status")
	}
	if err := h.removeNotReadyTaint(ctx); err != nil {
		h.logger.Error(err, "removing not-ready taint")
	}
	h.renewLease(ctx)
	return nil
}

func (h *Harness) removeNotReadyTaint(ctx context.Context) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := h.client.CoreV1().Nodes().Get(ctx, h.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		kept := slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(t v1.Taint) bool {
			return t.Key == v1.TaintNodeNotReady || t.Key == v1.TaintNodeUnreachable
		})
		if len(kept) == len(n.Spec.Taints) {
			return nil
		}
		n.Spec.Taints = kept
		if _, err := h.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			return err
		}
		h.logger.Info("removed not-ready taint")
		return nil
	})
}

// nodeStatus computes the status to post: base capacity + the device manager's
// extended resources (which it owns: a resource the manager no longer reports is
// removed), a Ready condition with a fresh heartbeat.
func (h *Harness) nodeStatus(old v1.NodeStatus, now time.Time) v1.NodeStatus {
	capacity := v1.ResourceList{
		v1.ResourceCPU:              h.cfg.CPU,
		v1.ResourceMemory:           h.cfg.Memory,
		v1.ResourcePods:             *resource.NewQuantity(h.cfg.Pods, resource.DecimalSI),
		v1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	allocatable := capacity.DeepCopy()
	h.mu.Lock()
	for name, r := range h.ext {
		capacity[name] = *resource.NewQuantity(r.capacity, resource.DecimalSI)
		allocatable[name] = *resource.NewQuantity(r.allocatable, resource.DecimalSI)
	}
	h.mu.Unlock()

	st := old.DeepCopy()
	st.Capacity = capacity
	st.Allocatable = allocatable
	mt := metav1.NewTime(now)
	set := func(t v1.NodeConditionType, s v1.ConditionStatus, reason, msg string) {
		for i := range st.Conditions {
			c := &st.Conditions[i]
			if c.Type == t {
				if c.Status != s {
					c.LastTransitionTime = mt
				}
				c.Status, c.Reason, c.Message, c.LastHeartbeatTime = s, reason, msg, mt
				return
			}
		}
		st.Conditions = append(st.Conditions, v1.NodeCondition{Type: t, Status: s, Reason: reason,
			Message: msg, LastHeartbeatTime: mt, LastTransitionTime: mt})
	}
	set(v1.NodeMemoryPressure, v1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available")
	set(v1.NodeDiskPressure, v1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure")
	set(v1.NodePIDPressure, v1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available")
	set(v1.NodeReady, v1.ConditionTrue, "KubeletReady", "gpu-node-harness is posting ready status")
	st.Phase = ""
	st.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}, {Type: v1.NodeHostName, Address: h.cfg.NodeName}}
	st.DaemonEndpoints = v1.NodeDaemonEndpoints{}
	st.NodeInfo = v1.NodeSystemInfo{
		MachineID:               "gpuops-harness-" + h.cfg.NodeName,
		SystemUUID:              "gpuops-harness-" + h.cfg.NodeName,
		BootID:                  "gpuops-harness",
		KernelVersion:           "harness",
		OSImage:                 "gpuops gpu-node-harness",
		ContainerRuntimeVersion: "harness://0",
		KubeletVersion:          kubeVersion(),
		OperatingSystem:         runtime.GOOS,
		Architecture:            runtime.GOARCH,
	}
	return *st
}

func (h *Harness) updateNodeStatus(ctx context.Context) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := h.client.CoreV1().Nodes().Get(ctx, h.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status = h.nodeStatus(n.Status, time.Now())
		_, err = h.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// renewLease creates or renews the node's Lease in kube-node-lease, which the node
// lifecycle controller reads as the heartbeat.
func (h *Harness) renewLease(ctx context.Context) {
	leases := h.client.CoordinationV1().Leases(leaseNamespace)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, h.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		h.mu.Lock()
		uid := h.nodeUID
		h.mu.Unlock()
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: h.cfg.NodeName, Namespace: leaseNamespace,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: h.cfg.NodeName, UID: uid}}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(h.cfg.NodeName),
				LeaseDurationSeconds: ptr.To[int32](leaseDuration), RenewTime: &now},
		}, metav1.CreateOptions{})
	} else if err == nil {
		l.Spec.HolderIdentity = ptr.To(h.cfg.NodeName)
		l.Spec.LeaseDurationSeconds = ptr.To[int32](leaseDuration)
		l.Spec.RenewTime = &now
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	}
	if err != nil && ctx.Err() == nil {
		h.logger.Error(err, "renewing node lease")
	}
}

func (h *Harness) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(h.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.renewLease(ctx)
		if err := h.updateNodeStatus(ctx); err != nil && ctx.Err() == nil {
			h.logger.Error(err, "node heartbeat")
		}
	}
}

// syncCapacity reads the device manager's capacity (as the kubelet's node status
// setter does: all devices = capacity, healthy = allocatable, removed resources
// dropped) and reports whether it changed.
func (h *Harness) syncCapacity() (changed bool, summary string) {
	capacity, allocatable, deleted := h.mgr.GetCapacity()
	next := map[string]extResource{}
	for name, q := range capacity {
		a := allocatable[name]
		next[string(name)] = extResource{capacity: q.Value(), allocatable: a.Value()}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	cur := map[string]extResource{}
	for n, r := range h.ext {
		cur[string(n)] = r
	}
	if maps.Equal(cur, next) {
		return false, ""
	}
	h.ext = map[v1.ResourceName]extResource{}
	var parts []string
	for n, r := range next {
		h.ext[v1.ResourceName(n)] = r
		parts = append(parts, fmt.Sprintf("%s=%d/%d", n, r.allocatable, r.capacity))
	}
	for _, n := range deleted {
		parts = append(parts, n+"=removed")
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		parts = []string{"none"}
	}
	return true, strings.Join(parts, " ")
}

func (h *Harness) capacityLoop(ctx context.Context) {
	t := time.NewTicker(h.cfg.CapacityInterval)
	defer t.Stop()
	dirty := false
	for {
		if changed, summary := h.syncCapacity(); changed {
			h.logger.Info("capacity changed (allocatable/capacity)", "resources", summary)
			dirty = true
		}
		if dirty {
			if err := h.updateNodeStatus(ctx); err != nil {
				if ctx.Err() == nil {
					h.logger.Error(err, "posting node capacity (will retry)")
				}
			} else {
				dirty = false
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
