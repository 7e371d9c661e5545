module github.com/lwiofs/lwiofs

go 1.26.0

require (
	github.com/BurntSushi/toml v1.6.0
	github.com/Mellanox/rdmamap v1.1.0
	github.com/cpuguy83/go-md2man/v2 v2.0.7
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/russross/blackfriday/v2 v2.1.0
	github.com/sirupsen/logrus v1.10.2
	golang.org/x/crypto v0.58.0
	golang.org/x/sys v0.49.0
	golang.org/x/term v0.47.0
)

require (
	github.com/vishvananda/netlink v1.1.0 // indirect
	github.com/vishvananda/netns v0.0.0-20191106174202-0a2b9b5464df // indirect
)

tool github.com/cpuguy83/go-md2man/v2
