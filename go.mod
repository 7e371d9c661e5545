module github.com/lwiofs/lwiofs

go 1.26.0

require (
	github.com/BurntSushi/toml v1.6.0
	github.com/Mellanox/rdmamap v1.1.0
	github.com/cpuguy83/go-md2man/v2 v2.0.7
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/prometheus/client_golang v1.25.0
	github.com/prometheus/client_model v0.6.3
	github.com/prometheus/common v0.72.0
	github.com/prometheus/procfs v0.22.0
	github.com/russross/blackfriday/v2 v2.1.0
	github.com/sirupsen/logrus v1.10.2
	golang.org/x/crypto v0.58.0
	golang.org/x/sys v0.49.0
	golang.org/x/term v0.47.0
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/vishvananda/netlink v1.1.0 // indirect
	github.com/vishvananda/netns v0.0.0-20191106174202-0a2b9b5464df // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

tool github.com/cpuguy83/go-md2man/v2
