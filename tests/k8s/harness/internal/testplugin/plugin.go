// Package testplugin is a tiny device plugin (API v1beta1) for testing the node
// harness: fake devices GPU-fake-0..n-1, NVIDIA_VISIBLE_DEVICES on Allocate,
// re-registration when kubelet.sock is recreated, a health toggle.
package testplugin

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Config of a plugin.
type Config struct {
	PluginDir        string // kubelet's device-plugins directory (kubelet.sock is there)
	Resource         string // e.g. nvidia.com/gpu
	Count            int
	SocketName       string // default: derived from Resource
	PreStartRequired bool   // ask the kubelet to call PreStartContainer
	CDIKind          string // if set, Allocate also returns CDI devices <kind>=<id>
	Logger           *log.Logger
}

// DefaultSocketName is "<resource with / and . as ->.sock", e.g. nvidia-com-gpu.sock.
func DefaultSocketName(resource string) string {
	return strings.NewReplacer("/", "-", ".", "-").Replace(resource) + ".sock"
}

// DeviceID is the ID of fake device i.
func DeviceID(i int) string { return fmt.Sprintf("GPU-fake-%d", i) }

// Plugin is a running test device plugin.
type Plugin struct {
	cfg Config
	log *log.Logger

	mu      sync.Mutex
	devs    []*pluginapi.Device
	changed chan struct{} // closed and replaced whenever devs change
	server  *grpc.Server
	regs    int

	pluginapi.UnimplementedDevicePluginServer
}

// New creates a plugin with all devices healthy.
func New(cfg Config) *Plugin {
	if cfg.SocketName == "" {
		cfg.SocketName = DefaultSocketName(cfg.Resource)
	}
	if cfg.Logger == nil {
		cfg.Logger = log.New(os.Stderr, "test-device-plugin: ", log.LstdFlags|log.Lmicroseconds)
	}
	p := &Plugin{cfg: cfg, log: cfg.Logger, changed: make(chan struct{})}
	for i := 0; i < cfg.Count; i++ {
		p.devs = append(p.devs, &pluginapi.Device{ID: DeviceID(i), Health: pluginapi.Healthy})
	}
	return p
}

// Registrations counts successful Register calls.
func (p *Plugin) Registrations() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.regs
}

// ToggleHealth flips device i between Healthy and Unhealthy and tells ListAndWatch.
func (p *Plugin) ToggleHealth(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i < 0 || i >= len(p.devs) {
		return
	}
	d := &pluginapi.Device{ID: p.devs[i].ID, Health: pluginapi.Healthy}
	if p.devs[i].Health == pluginapi.Healthy {
		d.Health = pluginapi.Unhealthy
	}
	p.devs = slices.Clone(p.devs)
	p.devs[i] = d
	close(p.changed)
	p.changed = make(chan struct{})
	p.log.Printf("device %s is now %s", d.ID, d.Health)
}

func (p *Plugin) socketPath() string { return filepath.Join(p.cfg.PluginDir, p.cfg.SocketName) }
func (p *Plugin) kubeletSock() string {
	return filepath.Join(p.cfg.PluginDir, filepath.Base(pluginapi.KubeletSocket))
}

// Run serves and registers, re-doing both whenever kubelet.sock is (re)created,
// until ctx is cancelled.
func (p *Plugin) Run(ctx context.Context) error {
	if err := os.MkdirAll(p.cfg.PluginDir, 0o755); err != nil {
		return err
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(p.cfg.PluginDir); err != nil {
		return err
	}
	defer p.stop()
	if err := p.serve(); err != nil {
		return err
	}
	if _, err := os.Stat(p.kubeletSock()); err == nil {
		p.register(ctx)
	} else {
		p.log.Printf("waiting for %s", p.kubeletSock())
	}
	for {
		select {
		case <-ctx.Done():
			p.log.Printf("stopping, removing %s", p.socketPath())
			return nil
		case err := <-w.Errors:
			p.log.Printf("watch error: %v", err)
		case ev := <-w.Events:
			switch {
			case ev.Name == p.kubeletSock() && ev.Has(fsnotify.Create):
				p.log.Printf("kubelet.sock created: kubelet (re)started, serving and registering again")
				if err := p.serve(); err != nil {
					return err
				}
				p.register(ctx)
			case ev.Name == p.kubeletSock() && ev.Has(fsnotify.Remove):
				p.log.Printf("kubelet.sock removed")
			case ev.Name == p.socketPath() && ev.Has(fsnotify.Remove):
				p.log.Printf("own socket %s removed (kubelet restart?)", p.socketPath())
			}
		}
	}
}

// serve (re)starts the gRPC server on a fresh socket.
func (p *Plugin) serve() error {
	p.stop()
	if err := os.Remove(p.socketPath()); err != nil && !os.IsNotExist(err) {
		return err
	}
	l, err := net.Listen("unix", p.socketPath())
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s, p)
	p.mu.Lock()
	p.server = s
	p.mu.Unlock()
	go func() { _ = s.Serve(l) }()
	p.log.Printf("serving %s on %s", p.cfg.Resource, p.socketPath())
	return nil
}

func (p *Plugin) stop() {
	p.mu.Lock()
	s := p.server
	p.server = nil
	p.mu.Unlock()
	if s != nil {
		s.Stop()
	}
}

// register calls Registration.Register on kubelet.sock, retrying for a few
// seconds (the socket file appears just before the kubelet accepts on it).
func (p *Plugin) register(ctx context.Context) {
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if err = p.registerOnce(ctx); err == nil {
			p.mu.Lock()
			p.regs++
			p.mu.Unlock()
			p.log.Printf("registered %s (endpoint %s) with %s", p.cfg.Resource, p.cfg.SocketName, p.kubeletSock())
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
	p.log.Printf("registration failed: %v (waiting for kubelet.sock to be recreated)", err)
}

func (p *Plugin) registerOnce(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+p.kubeletSock(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.cfg.SocketName,
		ResourceName: p.cfg.Resource,
		Options:      p.options(),
	})
	return err
}

func (p *Plugin) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{PreStartRequired: p.cfg.PreStartRequired, GetPreferredAllocationAvailable: true}
}

// GetDevicePluginOptions implements DevicePluginServer.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.options(), nil
}

// ListAndWatch sends the full device list now and after every change.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		p.mu.Lock()
		devs, changed := p.devs, p.changed
		p.mu.Unlock()
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		healthy := 0
		for _, d := range devs {
			if d.Health == pluginapi.Healthy {
				healthy++
			}
		}
		p.log.Printf("ListAndWatch: sent %d devices (%d healthy)", len(devs), healthy)
		select {
		case <-s.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// GetPreferredAllocation prefers the must-include devices, then the lowest IDs.
func (p *Plugin) GetPreferredAllocation(_ context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range r.ContainerRequests {
		ids := slices.Clone(cr.MustIncludeDeviceIDs)
		avail := slices.Clone(cr.AvailableDeviceIDs)
		slices.SortFunc(avail, compareIDs)
		for _, id := range avail {
			if len(ids) >= int(cr.AllocationSize) {
				break
			}
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		p.log.Printf("GetPreferredAllocation: size %d from %v -> %v", cr.AllocationSize, cr.AvailableDeviceIDs, ids)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// compareIDs orders GPU-fake-2 before GPU-fake-10.
func compareIDs(a, b string) int {
	if len(a) != len(b) {
		return len(a) - len(b)
	}
	return strings.Compare(a, b)
}

// Allocate returns NVIDIA_VISIBLE_DEVICES (and CDI devices when configured).
func (p *Plugin) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range r.ContainerRequests {
		ids := slices.Clone(cr.DevicesIds)
		slices.SortFunc(ids, compareIDs)
		for _, id := range ids {
			if !p.known(id) {
				return nil, fmt.Errorf("unknown device %q", id)
			}
		}
		c := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(ids, ",")}}
		if p.cfg.CDIKind != "" {
			for _, id := range ids {
				c.CdiDevices = append(c.CdiDevices, &pluginapi.CDIDevice{Name: p.cfg.CDIKind + "=" + id})
			}
		}
		p.log.Printf("Allocate: %v", ids)
		resp.ContainerResponses = append(resp.ContainerResponses, c)
	}
	return resp, nil
}

func (p *Plugin) known(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.ContainsFunc(p.devs, func(d *pluginapi.Device) bool { return d.ID == id })
}

// PreStartContainer only logs.
func (p *Plugin) PreStartContainer(_ context.Context, r *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	p.log.Printf("PreStartContainer: %v", r.DevicesIds)
	return &pluginapi.PreStartContainerResponse{}, nil
}
