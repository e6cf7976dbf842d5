// etcd for the connector's tests: the etcd server of go.etcd.io/etcd/server/v3 as a command.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
