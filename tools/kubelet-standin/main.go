// kubelet-standin is the part of a kubelet that a device plugin talks to, and nothing else: it
// serves the v1beta1 Registration service on DIR/kubelet.sock, starts the plugin given after "--",
// and, for each resource the plugin registers, opens ListAndWatch on the plugin's endpoint.
//
// It speaks JSON lines. Every device list the plugin sends, every registration and every answer
// goes to stdout as one object:
//
//	{"event":"registered","resource":"nvidia.com/gpu","endpoint":"nvidia-gpu.sock","options":{...}}
//	{"event":"devices","resource":"nvidia.com/gpu","devices":[{"ID":"GPU-...","health":"Healthy",...}]}
//	{"event":"allocate","resource":"nvidia.com/gpu","response":{...}}   (or "error":"...")
//	{"event":"stream-closed","resource":"nvidia.com/gpu","error":"..."}
//	{"event":"plugin-exited","error":"..."}
//
// and commands come on stdin, one a line:
//
//	allocate RESOURCE ID[,ID...]   the kubelet's Allocate for one container holding those devices
//	preferred RESOURCE AVAILABLE-ID[,...] SIZE   GetPreferredAllocation
//	restart                        stops the plugin (SIGTERM, then waits) and starts it again
//	stop                           stops the plugin and exits (so does the end of stdin)
//
// A real kubelet's plugin directory is /var/lib/kubelet/device-plugins, which NVIDIA's device
// plugin does not let one change; run this in a mount namespace with DIR bound there.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

var (
	outMu sync.Mutex
	out   = json.NewEncoder(os.Stdout)
)

// emit writes one event; msg (a protobuf message) goes under key in protojson's form.
func emit(fields map[string]any, key string, msg proto.Message) {
	if msg != nil {
		raw, err := protojson.MarshalOptions{EmitUnpopulated: false}.Marshal(msg)
		if err != nil {
			fields["error"] = err.Error()
		} else {
			fields[key] = json.RawMessage(raw)
		}
	}
	outMu.Lock()
	defer outMu.Unlock()
	if err := out.Encode(fields); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-standin: stdout:", err)
		os.Exit(1)
	}
}

type plugin struct {
	resource string
	endpoint string
	conn     *grpc.ClientConn
	client   pluginapi.DevicePluginClient
}

type kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	dir     string
	mu      sync.Mutex
	plugins map[string]*plugin
}

func (k *kubelet) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if r.Version != pluginapi.Version {
		return nil, fmt.Errorf("kubelet-standin: API version %q, want %q", r.Version, pluginapi.Version)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, r.Endpoint),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	p := &plugin{resource: r.ResourceName, endpoint: r.Endpoint, conn: conn, client: pluginapi.NewDevicePluginClient(conn)}
	k.mu.Lock()
	if old := k.plugins[r.ResourceName]; old != nil {
		old.conn.Close()
	}
	k.plugins[r.ResourceName] = p
	k.mu.Unlock()
	emit(map[string]any{"event": "registered", "resource": r.ResourceName, "endpoint": r.Endpoint}, "options", r.Options)
	go p.watch()
	return &pluginapi.Empty{}, nil
}

func (p *plugin) watch() {
	stream, err := p.client.ListAndWatch(context.Background(), &pluginapi.Empty{})
	for err == nil {
		var resp *pluginapi.ListAndWatchResponse
		if resp, err = stream.Recv(); err == nil {
			emit(map[string]any{"event": "devices", "resource": p.resource}, "list", resp)
		}
	}
	emit(map[string]any{"event": "stream-closed", "resource": p.resource, "error": err.Error()}, "", nil)
}

func (k *kubelet) get(resource string) *plugin {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.plugins[resource]
}

func (k *kubelet) command(line string) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return
	}
	fail := func(err error) {
		emit(map[string]any{"event": f[0], "error": err.Error()}, "", nil)
	}
	switch f[0] {
	case "allocate", "preferred":
		if len(f) < 3 {
			fail(fmt.Errorf("usage: %s RESOURCE ID[,ID...]", f[0]))
			return
		}
		p := k.get(f[1])
		if p == nil {
			fail(fmt.Errorf("no plugin registered %s", f[1]))
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ids := strings.Split(f[2], ",")
		if f[0] == "allocate" {
			resp, err := p.client.Allocate(ctx, &pluginapi.AllocateRequest{
				ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
			if err != nil {
				emit(map[string]any{"event": "allocate", "resource": f[1], "error": err.Error()}, "", nil)
				return
			}
			emit(map[string]any{"event": "allocate", "resource": f[1]}, "response", resp)
			return
		}
		size := 1
		if len(f) > 3 {
			size, _ = strconv.Atoi(f[3])
		}
		resp, err := p.client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
			ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: ids, AllocationSize: int32(size)}}})
		if err != nil {
			emit(map[string]any{"event": "preferred", "resource": f[1], "error": err.Error()}, "", nil)
			return
		}
		emit(map[string]any{"event": "preferred", "resource": f[1]}, "response", resp)
	default:
		fail(fmt.Errorf("unknown command %q", f[0]))
	}
}

type child struct {
	mu   sync.Mutex
	args []string
	cmd  *exec.Cmd
	done chan struct{}
}

func (c *child) start() error {
	cmd := exec.Command(c.args[0], c.args[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	c.mu.Lock()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()
	go func() {
		err := cmd.Wait()
		msg := "exit status 0"
		if err != nil {
			msg = err.Error()
		}
		emit(map[string]any{"event": "plugin-exited", "pid": cmd.Process.Pid, "error": msg}, "", nil)
		close(done)
	}()
	emit(map[string]any{"event": "plugin-started", "pid": cmd.Process.Pid}, "", nil)
	return nil
}

func (c *child) stop() {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func main() {
	dir := flag.String("dir", pluginapi.DevicePluginPath, "the kubelet's device plugin directory")
	flag.Parse()
	args := flag.Args()
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: kubelet-standin [--dir DIR] -- PLUGIN [ARGS...]")
		os.Exit(2)
	}
	sock := filepath.Join(*dir, "kubelet.sock")
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-standin:", err)
		os.Exit(1)
	}
	srv := grpc.NewServer()
	k := &kubelet{dir: *dir, plugins: map[string]*plugin{}}
	pluginapi.RegisterRegistrationServer(srv, k)
	go func() { _ = srv.Serve(lis) }()

	c := &child{args: args}
	if err := c.start(); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-standin: starting the plugin:", err)
		os.Exit(1)
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		switch line {
		case "stop":
			c.stop()
			srv.Stop()
			return
		case "restart":
			c.stop()
			if err := c.start(); err != nil {
				emit(map[string]any{"event": "restart", "error": err.Error()}, "", nil)
			}
		default:
			k.command(line)
		}
	}
	c.stop()
	srv.Stop()
}
