package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/admission"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// AllocationRecord is what <state-dir>/allocations/<namespace>_<pod>.json holds.
type AllocationRecord struct {
	Namespace  string                `json:"namespace"`
	Name       string                `json:"name"`
	UID        string                `json:"uid"`
	Node       string                `json:"node"`
	Containers []ContainerAllocation `json:"containers"`
}

// ContainerAllocation is one container's devices and the runtime options the
// device manager derived from the plugins' AllocateResponses.
type ContainerAllocation struct {
	Container    string              `json:"container"`
	Init         bool                `json:"init,omitempty"`
	Devices      map[string][]string `json:"devices"` // resource -> device IDs
	Envs         map[string]string   `json:"envs"`
	Mounts       []MountRecord       `json:"mounts"`
	DevicesSpecs []DeviceSpecRecord  `json:"devices_specs"`
	Annotations  map[string]string   `json:"annotations"`
	CDIDevices   []string            `json:"cdi_devices"`
}

type MountRecord struct {
	ContainerPath string `json:"container_path"`
	HostPath      string `json:"host_path"`
	ReadOnly      bool   `json:"read_only"`
}

type DeviceSpecRecord struct {
	ContainerPath string `json:"container_path"`
	HostPath      string `json:"host_path"`
	Permissions   string `json:"permissions"`
}

// AllocationFile is the record path for a pod.
func AllocationFile(stateDir, namespace, name string) string {
	return filepath.Join(stateDir, "allocations", namespace+"_"+name+".json")
}

func (h *Harness) podWorker(ctx context.Context) {
	for {
		key, quit := h.queue.Get()
		if quit {
			return
		}
		err := h.syncPod(ctx, key)
		if err != nil && ctx.Err() == nil {
			h.logger.Error(err, "pod sync failed (will retry)", "pod", key)
			h.queue.AddRateLimited(key)
		} else {
			h.queue.Forget(key)
		}
		h.queue.Done(key)
	}
}

// syncPod is the kubelet's pod lifecycle, reduced to what a device plugin sees.
func (h *Harness) syncPod(ctx context.Context, key string) error {
	obj, exists, err := h.pods.GetIndexer().GetByKey(key)
	if err != nil {
		return err
	}
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	if !exists {
		// Gone from the API: free its devices (the pod is no longer active).
		h.mgr.UpdateAllocatedDevices()
		if err := os.Remove(AllocationFile(h.cfg.StateDir, ns, name)); err == nil {
			h.logger.Info("pod deleted, devices released", "pod", key)
		}
		return nil
	}
	pod := obj.(*v1.Pod)
	if pod.Spec.NodeName != h.cfg.NodeName {
		return nil
	}
	if pod.DeletionTimestamp != nil {
		// A kubelet kills the containers, then confirms the deletion with grace 0.
		err := h.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{
			GracePeriodSeconds: new(int64),
			Preconditions:      metav1.NewUIDPreconditions(string(pod.UID)),
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
		h.logger.Info("pod terminating: containers stopped, deletion confirmed", "pod", key)
		return nil
	}
	if isTerminal(pod) {
		h.mgr.UpdateAllocatedDevices()
		return nil
	}
	h.mu.Lock()
	done := h.handled[pod.UID]
	h.mu.Unlock()
	if done {
		return nil
	}
	if pod.Status.Phase == v1.PodRunning {
		// Running before this harness (re)started: like a kubelet restart with the
		// containers still up, keep its checkpointed devices, do not admit again.
		h.markHandled(pod, false)
		h.logger.Info("pod already running, keeping its devices", "pod", key, "uid", pod.UID)
		return nil
	}
	return h.admitAndStart(ctx, pod)
}

func (h *Harness) markHandled(pod *v1.Pod, rejected bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.handled[pod.UID] = true
	if rejected {
		h.rejected[pod.UID] = true
	}
}

type containerRef struct {
	c    *v1.Container
	init bool
}

// allContainers lists init containers first, as the kubelet admits them.
func allContainers(pod *v1.Pod) []containerRef {
	var out []containerRef
	for i := range pod.Spec.InitContainers {
		out = append(out, containerRef{&pod.Spec.InitContainers[i], true})
	}
	for i := range pod.Spec.Containers {
		out = append(out, containerRef{&pod.Spec.Containers[i], false})
	}
	return out
}

// admitAndStart runs the kubelet's device admission (the topology manager's
// "none" policy calls Allocate for every init then app container), then what
// container start does (GetDeviceRunContainerOptions, which calls PreStartContainer
// when the plugin asks for it), records the result and marks the pod Running.
func (h *Harness) admitAndStart(ctx context.Context, pod *v1.Pod) error {
	key := klog.KObj(pod)
	for _, e := range allContainers(pod) {
		if err := h.mgr.Allocate(pod, e.c); err != nil {
			return h.reject(ctx, pod, err)
		}
	}
	rec := AllocationRecord{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID), Node: h.cfg.NodeName,
		Containers: []ContainerAllocation{}}
	for _, e := range allContainers(pod) {
		opts, err := h.mgr.GetDeviceRunContainerOptions(ctx, pod, e.c)
		if err != nil {
			h.recorder.Eventf(pod, v1.EventTypeWarning, "Failed", "Error: %v", err)
			h.setContainerConfigError(ctx, pod, e.c.Name, err)
			return fmt.Errorf("container %s: %w", e.c.Name, err)
		}
		rec.Containers = append(rec.Containers, h.containerRecord(pod, e.c.Name, e.init, opts))
	}
	if err := writeJSONAtomic(AllocationFile(h.cfg.StateDir, pod.Namespace, pod.Name), rec); err != nil {
		return err
	}
	for _, c := range rec.Containers {
		if len(c.Devices) > 0 {
			h.logger.Info("devices allocated", "pod", key, "container", c.Container, "devices", c.Devices,
				"envs", c.Envs, "cdi", c.CDIDevices)
		}
	}
	if err := h.setRunning(ctx, pod); err != nil {
		return err
	}
	h.markHandled(pod, false)
	h.recorder.Event(pod, v1.EventTypeNormal, "Started", "Started containers (gpu-node-harness)")
	h.logger.Info("pod running", "pod", key, "uid", pod.UID)
	return nil
}

func (h *Harness) containerRecord(pod *v1.Pod, name string, init bool, opts *devicemanager.DeviceRunContainerOptions) ContainerAllocation {
	ca := ContainerAllocation{Container: name, Init: init, Devices: map[string][]string{}, Envs: map[string]string{},
		Mounts: []MountRecord{}, DevicesSpecs: []DeviceSpecRecord{}, Annotations: map[string]string{}, CDIDevices: []string{}}
	for res, devs := range h.mgr.GetDevices(string(pod.UID), name) {
		ids := make([]string, 0, len(devs))
		for id := range devs {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		ca.Devices[res] = ids
	}
	if opts == nil {
		return ca
	}
	for _, e := range opts.Envs {
		ca.Envs[e.Name] = e.Value
	}
	for _, m := range opts.Mounts {
		ca.Mounts = append(ca.Mounts, MountRecord{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly})
	}
	for _, d := range opts.Devices {
		ca.DevicesSpecs = append(ca.DevicesSpecs, DeviceSpecRecord{ContainerPath: d.PathInContainer, HostPath: d.PathOnHost, Permissions: d.Permissions})
	}
	for _, a := range opts.Annotations {
		ca.Annotations[a.Name] = a.Value
	}
	for _, c := range opts.CDIDevices {
		ca.CDIDevices = append(ca.CDIDevices, c.Name)
	}
	return ca
}

// reject fails the pod the way the kubelet's rejectPod does after a failed
// admission: phase Failed, reason UnexpectedAdmissionError, a Warning event.
func (h *Harness) reject(ctx context.Context, pod *v1.Pod, allocErr error) error {
	res := admission.GetPodAdmitResult(allocErr)
	msg := "Pod was rejected: " + res.Message
	h.logger.Info("pod rejected", "pod", klog.KObj(pod), "reason", res.Reason, "message", msg)
	h.markHandled(pod, true)
	// The rejected pod is no longer active: free whatever was allocated to its
	// containers before the failing one.
	h.mgr.UpdateAllocatedDevices()
	h.recorder.Eventf(pod, v1.EventTypeWarning, res.Reason, res.Message)
	return h.updatePodStatus(ctx, pod, func(p *v1.Pod) {
		p.Status = v1.PodStatus{QOSClass: p.Status.QOSClass, Phase: v1.PodFailed, Reason: res.Reason, Message: msg,
			Conditions: p.Status.Conditions, StartTime: p.Status.StartTime}
	})
}

func (h *Harness) setContainerConfigError(ctx context.Context, pod *v1.Pod, container string, err error) {
	uerr := h.updatePodStatus(ctx, pod, func(p *v1.Pod) {
		for _, c := range p.Spec.Containers {
			if c.Name != container {
				continue
			}
			p.Status.ContainerStatuses = []v1.ContainerStatus{{Name: c.Name, Image: c.Image,
				State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "CreateContainerConfigError", Message: err.Error()}}}}
		}
	})
	if uerr != nil {
		h.logger.Error(uerr, "updating pod status", "pod", klog.KObj(pod))
	}
}

func (h *Harness) updatePodStatus(ctx context.Context, pod *v1.Pod, mutate func(*v1.Pod)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := h.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if p.UID != pod.UID {
			return nil
		}
		mutate(p)
		_, err = h.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
}

func (h *Harness) setRunning(ctx context.Context, pod *v1.Pod) error {
	return h.updatePodStatus(ctx, pod, func(p *v1.Pod) { p.Status = runningStatus(p, time.Now()) })
}

// runningStatus is the status of a pod whose init containers completed and whose
// containers all started and are ready.
func runningStatus(p *v1.Pod, now time.Time) v1.PodStatus {
	mt := metav1.NewTime(now)
	st := p.Status.DeepCopy()
	st.Phase = v1.PodRunning
	st.Reason, st.Message = "", ""
	st.HostIP = "127.0.0.1"
	st.HostIPs = []v1.HostIP{{IP: "127.0.0.1"}}
	if st.StartTime == nil {
		st.StartTime = &mt
	}
	setPodCondition(st, v1.PodReadyToStartContainers, mt)
	setPodCondition(st, v1.PodInitialized, mt)
	setPodCondition(st, v1.ContainersReady, mt)
	setPodCondition(st, v1.PodReady, mt)
	st.InitContainerStatuses = nil
	for _, c := range p.Spec.InitContainers {
		cs := v1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image,
			ContainerID: fmt.Sprintf("harness://%s/%s", p.UID, c.Name)}
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			cs.Ready, cs.Started = true, ptrTrue()
			cs.State.Running = &v1.ContainerStateRunning{StartedAt: mt}
		} else {
			cs.Ready, cs.Started = true, ptrFalse()
			cs.State.Terminated = &v1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: mt, FinishedAt: mt,
				ContainerID: cs.ContainerID}
		}
		st.InitContainerStatuses = append(st.InitContainerStatuses, cs)
	}
	st.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses, v1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image,
			ContainerID: fmt.Sprintf("harness://%s/%s", p.UID, c.Name), Ready: true, Started: ptrTrue(),
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: mt}}})
	}
	return *st
}

func ptrTrue() *bool  { b := true; return &b }
func ptrFalse() *bool { b := false; return &b }

func setPodCondition(st *v1.PodStatus, t v1.PodConditionType, now metav1.Time) {
	for i := range st.Conditions {
		if st.Conditions[i].Type == t {
			if st.Conditions[i].Status != v1.ConditionTrue {
				st.Conditions[i].LastTransitionTime = now
			}
			st.Conditions[i].Status, st.Conditions[i].Reason, st.Conditions[i].Message = v1.ConditionTrue, "", ""
			return
		}
	}
	st.Conditions = append(st.Conditions, v1.PodCondition{Type: t, Status: v1.ConditionTrue, LastTransitionTime: now})
}

func writeJSONAtomic(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
