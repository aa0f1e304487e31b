module torbed.local/netcheck

go 1.22
