package harness

import (
	"fmt"
	"path/filepath"
	_ "unsafe" // for go:linkname

	cadvisorapi "github.com/google/cadvisor/info/v1"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

// newManagerImpl is the kubelet's own device manager constructor
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager, manager.go). The exported
// NewManagerImpl hard-codes /var/lib/kubelet/device-plugins/kubelet.sock; the
// unexported one, which NewManagerImpl calls and the upstream unit tests use,
// takes the socket path. Linking to it gives us the unmodified kubelet code with
// a per-node plugin directory. The signature is that of k8s.io/kubernetes v1.35.4;
// a version bump that changes it fails at build or link time, not silently.
//
//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(logger klog.Logger, socketPath string, topology []cadvisorapi.Node, topologyAffinityStore topologymanager.Store) (*devicemanager.ManagerImpl, error)

// noTopology is the topology-manager store of a node with the "none" policy and no
// NUMA information: every container gets an empty hint, so the device manager
// neither filters by NUMA affinity nor needs cadvisor.
type noTopology struct{}

func (noTopology) GetAffinity(podUID string, containerName string) topologymanager.TopologyHint {
	return topologymanager.TopologyHint{}
}
func (noTopology) GetPolicy() topologymanager.Policy { return topologymanager.NewNonePolicy() }

// NewDeviceManager builds the kubelet's device manager serving the Registration
// service on <pluginDir>/kubelet.sock. Like the kubelet, it keeps its checkpoint
// (kubelet_internal_checkpoint) in the same directory as the socket.
func NewDeviceManager(logger klog.Logger, pluginDir string) (*devicemanager.ManagerImpl, error) {
	abs, err := filepath.Abs(pluginDir)
	if err != nil {
		return nil, err
	}
	m, err := newManagerImpl(logger, filepath.Join(abs, "kubelet.sock"), nil, noTopology{})
	if err != nil {
		return nil, fmt.Errorf("creating device manager: %w", err)
	}
	return m, nil
}
