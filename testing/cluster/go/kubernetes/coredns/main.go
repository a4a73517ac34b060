// CoreDNS with the plugins a cluster's DNS runs (kubeadm's Corefile, less forwarding: no
// name outside the cluster resolves here), built as CoreDNS documents for a custom set of
// plugins: its own coremain, the plugins imported for their registration.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func init() {
	// The order plugins run in, as CoreDNS's generated list has it, for those built here.
	dnsserver.Directives = []string{
		"bind", "ready", "health", "errors", "loadbalance", "cache", "kubernetes",
	}
}

func main() {
	coremain.Run()
}
