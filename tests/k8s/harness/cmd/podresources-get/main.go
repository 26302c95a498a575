// podresources-get queries a PodResources v1 socket and prints the answer as JSON:
// `podresources-get --socket S [list|allocatable|get NAMESPACE NAME]` (default list).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func main() {
	socket := flag.String("socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "PodResources socket")
	flag.Parse()
	args := flag.Args()
	if len(args) == 0 {
		args = []string{"list"}
	}
	conn, err := grpc.NewClient("unix://"+*socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := podresourcesv1.NewPodResourcesListerClient(conn)
	var resp proto.Message
	switch {
	case args[0] == "list":
		resp, err = c.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	case args[0] == "allocatable":
		resp, err = c.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	case args[0] == "get" && len(args) == 3:
		resp, err = c.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: args[1], PodName: args[2]})
	default:
		fmt.Fprintln(os.Stderr, "usage: podresources-get --socket S [list|allocatable|get NAMESPACE NAME]")
		os.Exit(2)
	}
	if err != nil {
		fail(err)
	}
	out, err := protojson.MarshalOptions{Multiline: true, UseProtoNames: true}.Marshal(resp)
	if err != nil {
		fail(err)
	}
	fmt.Println(string(out))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "podresources-get:", err)
	os.Exit(1)
}
