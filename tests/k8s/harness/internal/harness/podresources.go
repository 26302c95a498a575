package harness

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sort"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	podresourcesv1alpha1 "k8s.io/kubelet/pkg/apis/podresources/v1alpha1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// servePodResources serves the kubelet's own PodResources servers (v1 and
// v1alpha1) on socket, with the device manager as DevicesProvider and the pod
// informer as PodsProvider. CPU, memory and DRA providers are empty.
func (h *Harness) servePodResources(ctx context.Context, socket string) (stop func(), err error) {
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return nil, err
	}
	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	l, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	providers := podresources.PodResourcesProviders{
		Pods:             podsProvider{h},
		Devices:          devicesProvider{h.mgr},
		Cpus:             emptyProvider{},
		Memory:           emptyProvider{},
		DynamicResources: emptyProvider{},
	}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, podresources.NewV1PodResourcesServer(ctx, providers))
	podresourcesv1alpha1.RegisterPodResourcesListerServer(srv, podresources.NewV1alpha1PodResourcesServer(providers))
	go func() {
		if err := srv.Serve(l); err != nil {
			h.logger.Error(err, "podresources server")
		}
	}()
	h.logger.Info("serving PodResources API", "socket", socket)
	return func() {
		srv.Stop()
		_ = os.Remove(socket)
		h.logger.Info("PodResources server stopped")
	}, nil
}

type podsProvider struct{ h *Harness }

func (p podsProvider) GetActivePods() []*v1.Pod { return p.h.activePods() }
func (p podsProvider) GetPods() []*v1.Pod       { return p.h.allPods() }
func (p podsProvider) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	obj, ok, err := p.h.pods.GetIndexer().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil, false
	}
	pod := obj.(*v1.Pod)
	return pod, pod.Spec.NodeName == p.h.cfg.NodeName
}

type devicesProvider struct{ m *devicemanager.ManagerImpl }

func (d devicesProvider) UpdateAllocatedDevices() { d.m.UpdateAllocatedDevices() }
func (d devicesProvider) GetDevices(podUID, containerName string) []*podresourcesv1.ContainerDevices {
	return containerDevices(d.m.GetDevices(podUID, containerName))
}
func (d devicesProvider) GetAllocatableDevices() []*podresourcesv1.ContainerDevices {
	return containerDevices(d.m.GetAllocatableDevices())
}

// containerDevices is the kubelet container manager's
// containerDevicesFromResourceDeviceInstances (pkg/kubelet/cm/container_manager.go,
// not importable without the whole cgroup stack), plus a stable order.
func containerDevices(devs devicemanager.ResourceDeviceInstances) []*podresourcesv1.ContainerDevices {
	var out []*podresourcesv1.ContainerDevices
	for resourceName, resourceDevs := range devs {
		for devID, dev := range resourceDevs {
			topo := dev.GetTopology()
			if topo == nil {
				out = append(out, &podresourcesv1.ContainerDevices{ResourceName: resourceName, DeviceIds: []string{devID}})
				continue
			}
			for _, node := range topo.GetNodes() {
				out = append(out, &podresourcesv1.ContainerDevices{ResourceName: resourceName, DeviceIds: []string{devID},
					Topology: &podresourcesv1.TopologyInfo{Nodes: []*podresourcesv1.NUMANode{{ID: node.GetID()}}}})
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].ResourceName != out[j].ResourceName {
			return out[i].ResourceName < out[j].ResourceName
		}
		return out[i].DeviceIds[0] < out[j].DeviceIds[0]
	})
	return out
}

type emptyProvider struct{}

func (emptyProvider) GetCPUs(string, string) []int64                             { return nil }
func (emptyProvider) GetAllocatableCPUs() []int64                                { return []int64{} }
func (emptyProvider) GetMemory(string, string) []*podresourcesv1.ContainerMemory { return nil }
func (emptyProvider) GetAllocatableMemory() []*podresourcesv1.ContainerMemory    { return nil }
func (emptyProvider) GetDynamicResources(*v1.Pod, *v1.Container) []*podresourcesv1.DynamicResource {
	return nil
}
