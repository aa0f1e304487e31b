{{/*
Cross-field checks of the scenario, the same ones torbed.scenario makes after decoding
(values.schema.json covers each field on its own). Each problem is reported as
"<field path>: <message>", as `torbed validate` reports it; rendering fails with all of them.
*/}}
{{- define "torbed.validate" -}}
{{- $v := .Values -}}
{{- $problems := list -}}
{{- $relays := $v.network.relays | default dict -}}
{{- $servers := $v.servers | default dict -}}
{{- $clients := $v.clients | default dict -}}
{{- $reserved := list "authority" "auth" "switch" "collector" "load" "locust" -}}
{{- $families := ((.Files.Get "files/variants.yaml") | fromYaml).families -}}

{{- /* Group names share one namespace (checked in torbed's order: relays, servers, clients). */ -}}
{{- $seen := dict -}}
{{- range $pair := list (list "network.relays" $relays) (list "servers" $servers) (list "clients" $clients) -}}
{{- $kind := index $pair 0 -}}
{{- range $g, $_ := index $pair 1 -}}
{{- if has $g $reserved }}{{ $problems = append $problems (printf "%s.%s: '%s' is reserved (reserved: %s)" $kind $g $g (join ", " (sortAlpha $reserved))) }}{{ end -}}
{{- if hasKey $seen $g }}{{ $problems = append $problems (printf "%s.%s: group name '%s' is also used in %s; names must be unique" $kind $g $g (index $seen $g)) }}{{ end -}}
{{- $_ := set $seen $g $kind -}}
{{- end -}}
{{- end -}}

{{- /* Background load (the same checks as torbed.scenario's). */ -}}
{{- if include "torbed.load" . -}}
{{- $ld := $v.load -}}
{{- range $i, $hop := $ld.path | default list -}}
{{- if not (hasKey $relays $hop) }}{{ $problems = append $problems (printf "load.path[%d]: '%s' is not a relay group (relay groups: %s)" $i $hop (join ", " (keys $relays | sortAlpha))) }}{{ end -}}
{{- end -}}
{{- if $ld.path -}}
{{- $last := last $ld.path -}}
{{- if and (hasKey $relays $last) (not (index $relays $last).exit) }}{{ $problems = append $problems (printf "load.path[2]: a path must end at an exit group; '%s' has no 'exit: true'" $last) }}{{ end -}}
{{- end -}}
{{- $server := $ld.server | default "" -}}
{{- if and (not $server) (ne (len $servers) 1) -}}
{{- $problems = append $problems (printf "load.server: required when there is more than one server group (%s)" (join ", " (keys $servers | sortAlpha))) -}}
{{- else -}}
{{- if not $server }}{{ $server = first (keys $servers) }}{{ end -}}
{{- if not (hasKey $servers $server) -}}
{{- $problems = append $problems (printf "load.server: '%s' is not a server group (servers: %s)" $server (join ", " (keys $servers | sortAlpha))) -}}
{{- else if not (index $servers $server).files -}}
{{- $problems = append $problems (printf "load.server: server '%s' serves no HTTP files (the users' files are added to its 'files')" $server) -}}
{{- end -}}
{{- end -}}
{{- if gt (int ($ld.workers | default 1)) (int ($ld.users | default 10)) }}{{ $problems = append $problems (printf "load.workers: %v workers for %v users: some would run no user" ($ld.workers | default 1) ($ld.users | default 10)) }}{{ end -}}
{{- with $ld.mix -}}
{{- $weights := 0.0 -}}
{{- range $name, $r := . -}}
{{- $weights = addf $weights (float64 ($r.weight | default 0)) -}}
{{- if and $r.think (eq ($r.think.distribution | default "exponential") "uniform") (or (not $r.think.min) (not $r.think.max)) -}}
{{- $problems = append $problems (printf "load.mix.%s.think: a uniform distribution needs 'min' and 'max'" $name) -}}
{{- end -}}
{{- end -}}
{{- if le $weights 0.0 }}{{ $problems = append $problems "load.mix: every weight is 0: the users would send nothing" }}{{ end -}}
{{- end -}}
{{- $end := float64 (include "torbed.seconds" (($v.measure | default dict).duration | default "5m")) -}}
{{- $start := float64 (include "torbed.seconds" ($ld.start | default "0s")) -}}
{{- if ge $start $end }}{{ $problems = append $problems (printf "load.start: %s is not before the end of the workload" ($ld.start | default "0s")) }}{{ end -}}
{{- if $ld.stop -}}
{{- $stop := float64 (include "torbed.seconds" $ld.stop) -}}
{{- if le $stop $start }}{{ $problems = append $problems (printf "load.stop: %s is not after load.start (%s)" $ld.stop ($ld.start | default "0s")) }}
{{- else if gt $stop $end }}{{ $problems = append $problems (printf "load.stop: %s is after the end of the workload" $ld.stop) }}{{ end -}}
{{- end -}}
{{- end -}}

{{- /* What only the local backend carries out (torbed's K8sBackend.unsupported says the same
for `torbed run --backend k8s`): refused here rather than silently not done. */ -}}
{{- range $g, $rg := $relays -}}
{{- if and $rg.cpu (ne (toString $rg.cpu) "native") }}{{ $problems = append $problems (printf "network.relays.%s.cpu: qemu emulates a slow CPU on the local backend only (on Kubernetes, place the group on a slow node instead: placement)" $g) }}{{ end -}}
{{- if $rg.cpu_per_thread }}{{ $problems = append $problems (printf "network.relays.%s.cpu_per_thread: per-thread CPU caps are set by the local backend only (on Kubernetes, place the group on a slow node instead: placement)" $g) }}{{ end -}}
{{- if $rg.second_address }}{{ $problems = append $problems (printf "network.relays.%s.second_address: a relay's second address on a link of its own is a second veth in its network namespace, on the local backend only (a pod has one address)" $g) }}{{ end -}}
{{- end -}}
{{- /* Voted consensus weights (the keygen hook writes the authorities' bandwidth file): on every relay group or none, with 3 or more authorities. */ -}}
{{- $withW := list -}}{{- $withoutW := list -}}
{{- range $g, $rg := $relays -}}
{{- if $rg.weights }}{{ $withW = append $withW $g }}{{ else }}{{ $withoutW = append $withoutW $g }}{{ end -}}
{{- if and $rg.weights (ne (len $rg.weights) (int ($rg.count | default 1))) }}{{ $problems = append $problems (printf "network.relays.%s.weights: %d weights for %d relays; give one per relay" $g (len $rg.weights) (int ($rg.count | default 1))) }}{{ end -}}
{{- end -}}
{{- if and $withW $withoutW }}{{ $problems = append $problems (printf "network.relays: weights are set on %s but not on %s: set them on every relay group or none (an unmeasured relay's weight is capped at 20 when the others are measured)" (join ", " (sortAlpha $withW)) (join ", " (sortAlpha $withoutW))) }}{{ end -}}
{{- $nAuth := int (($v.network.authorities) | default 3) -}}
{{- if and $withW (lt $nAuth 3) }}{{ $problems = append $problems (printf "network.authorities: %d authorities: relay weights need 3 or more (tor uses voted measurements only when more than two authorities vote them)" $nAuth) }}{{ end -}}
{{- if $v.samples }}{{ $problems = append $problems "samples: a Helm release is one network, and a network sampled anew per block needs one per block: torbed run installs a release per block (--backend k8s) or runs them locally" }}{{ end -}}
{{- if $v.crossover }}{{ $problems = append $problems "crossover: a within-run crossover switches the relays through their control ports on the local backend only (torbed run --backend local)" }}{{ end -}}

{{- /* Variants. */ -}}
{{- if ne (len (uniq $v.variants)) (len $v.variants) }}{{ $problems = append $problems "variants: variants must be unique" }}{{ end -}}
{{- $toCheck := dict -}}
{{- range $i, $name := $v.variants }}{{ $_ := set $toCheck (printf "variants[%d]" $i) $name }}{{ end -}}
{{- range $g, $rg := $relays }}{{ if $rg.variant }}{{ $_ := set $toCheck (printf "network.relays.%s.variant" $g) $rg.variant }}{{ end }}{{ end -}}
{{- range $field, $name := $toCheck -}}
{{- $family := include "torbed.family" $name -}}
{{- $arg := trimPrefix (printf "%s-" $family) $name -}}
{{- if eq $arg $name }}{{ $arg = "" }}{{ end -}}
{{- if not (hasKey $families $family) -}}
{{- $problems = append $problems (printf "%s: unknown variant '%s' (known: %s; parametrised families take a value, e.g. ewma-66)" $field $name (join ", " (keys $families | sortAlpha))) -}}
{{- else -}}
{{- $f := index $families $family -}}
{{- if and $arg (not $f.parameters) -}}
{{- $problems = append $problems (printf "%s: variant '%s' takes no parameter, got '%s'" $field $family $name) -}}
{{- else if and $arg (not (hasKey ($f.presets | default dict) $arg)) -}}
{{- $p := first $f.parameters -}}
{{- if not (regexMatch "^[0-9]+(\\.[0-9]+)?$" $arg) -}}
{{- $problems = append $problems (printf "%s: variant '%s': '%s' is not a number for parameter '%s' and not a preset of '%s'" $field $name $arg $p.name $family) -}}
{{- else if or (and (kindIs "float64" $p.min) (lt (float64 $arg) (float64 $p.min))) (and (kindIs "float64" $p.max) (gt (float64 $arg) (float64 $p.max))) -}}
{{- $problems = append $problems (printf "%s: variant '%s': %s=%s outside [%v, %v]" $field $name $p.name $arg $p.min $p.max) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $v.baseline (not (has $v.baseline $v.variants)) -}}
{{- $problems = append $problems (printf "baseline: '%s' is not one of variants (%s)" $v.baseline (join ", " $v.variants)) -}}
{{- end -}}
{{- if and $v.variant (not (has $v.variant $v.variants)) -}}
{{- $problems = append $problems (printf "variant: '%s' is not one of the scenario's variants (%s)" $v.variant (join ", " $v.variants)) -}}
{{- end -}}

{{- /* Network: the schema's pattern holds the subnet to RFC 1918 and /24 or larger; the host bits here. */ -}}
{{- with ($v.network | default dict).subnet -}}
{{- $parts := regexSplit "[./]" . -1 -}}
{{- $addr := 0 -}}
{{- range $i := until 4 }}{{ $addr = add (mul $addr 256) (atoi (index $parts $i)) }}{{ end -}}
{{- $block := 1 -}}
{{- range until (sub 32 (atoi (index $parts 4)) | int) }}{{ $block = mul $block 2 }}{{ end -}}
{{- if ne (mod $addr $block) 0 }}{{ $problems = append $problems (printf "network.subnet: not an IPv4 network: %s has host bits set" .) }}{{ end -}}
{{- end -}}

{{- /* ... and holds every node: they take consecutive addresses from .firstNodeHost up (network.plan). */ -}}
{{- $subnet := ($v.network | default dict).subnet | default (($.Files.Get "files/network.yaml") | fromYaml).defaultSubnet -}}
{{- $nodes := int (include "torbed.authorityCount" .) -}}
{{- range $_, $x := $relays }}{{ $nodes = add $nodes ($x.count | default 1) }}{{ end -}}
{{- range $_, $x := $servers }}{{ $nodes = add $nodes ($x.count | default 1) }}{{ end -}}
{{- range $_, $x := $clients }}{{ $nodes = add $nodes ($x.count | default 1) }}{{ end -}}
{{- if include "torbed.load" . }}{{ $nodes = add $nodes (int (include "torbed.loadWorkers" .)) 1 }}{{ end -}}
{{- $size := 1 -}}
{{- range until (sub 32 (atoi (last (splitList "/" $subnet))) | int) }}{{ $size = mul $size 2 }}{{ end -}}
{{- $room := sub (sub $size 1) (($.Files.Get "files/network.yaml") | fromYaml).firstNodeHost -}}
{{- if gt $nodes $room }}{{ $problems = append $problems (printf "network.subnet: '%s' has room for %d nodes; the scenario has %d: use a larger range" $subnet $room $nodes) }}{{ end -}}

{{- /* Relay groups' extra torrc lines: read as torbed.torrc_policy reads them (one line at a
time, a backslash at the end continuing it), each option judged by files/torrc-policy.yaml. */ -}}
{{- $policy := (.Files.Get "files/torrc-policy.yaml") | fromYaml -}}
{{- range $g, $rg := $relays -}}
{{- $field := printf "network.relays.%s.torrc" $g -}}
{{- $text := toString ($rg.torrc | default "") -}}
{{- if regexMatch $policy.badChars $text -}}
{{- $problems = append $problems (printf "%s: a control character or white space other than spaces, tabs and newlines is not allowed (torrc lines take printable characters, spaces and tabs)" $field) -}}
{{- else -}}
{{- $lines := splitList "\n" (trim $text) -}}
{{- $continued := false -}}
{{- range $i, $raw := $lines -}}
{{- $line := trim $raw -}}
{{- $last := eq (add1 $i) (len $lines) -}}
{{- $where := printf "%s: line %d: '%s'" $field (add1 $i) $line -}}
{{- if $continued -}}
{{- if contains "#" $line }}{{ $problems = append $problems (printf "%s: a comment inside a continued line (tor would read the lines after it as part of the value); remove it" $where) }}{{ end -}}
{{- $continued = hasSuffix "\\" $line -}}
{{- if and $continued $last }}{{ $problems = append $problems (printf "%s: the last line ends with a backslash (it continues onto nothing)" $where) }}{{ end -}}
{{- else if and $line (not (hasPrefix "#" $line)) -}}
{{- $key := regexFind "^[^ \t#]*" $line -}}
{{- $value := trim (first (splitList "#" (trimPrefix $key $line))) -}}
{{- $continued = hasSuffix "\\" $line -}}
{{- if and $continued (contains "#" $line) -}}
{{- $problems = append $problems (printf "%s: a comment on a continued line (tor would end the line at the comment); remove it" $where) -}}
{{- else if and $continued $last -}}
{{- $problems = append $problems (printf "%s: the last line ends with a backslash (it continues onto nothing)" $where) -}}
{{- else if hasPrefix "%" $key -}}
{{- $problems = append $problems (printf "%s: %s" $where $policy.include) -}}
{{- else if not (regexMatch $policy.nameRe $key) -}}
{{- $problems = append $problems (printf "%s: '%s' is not an option name (letters, digits and _, after an optional + or /)" $where $key) -}}
{{- else if hasPrefix "\"" $value -}}
{{- $problems = append $problems (printf "%s: quoted values are not accepted (no option on the allow-list needs one)" $where) -}}
{{- else -}}
{{- $name := trimPrefix "/" (trimPrefix "+" $key) -}}
{{- $opt := index $policy.options (lower $name) -}}
{{- /* A patched tor's own options: accepted when every variant the group runs has them. */ -}}
{{- $groupVariants := ternary (list $rg.variant) ($v.variants | default list) (not (empty $rg.variant)) -}}
{{- $byVariant := gt (len $groupVariants) 0 -}}
{{- range $vn := $groupVariants -}}
{{- if not (hasKey (index $policy.variantOptions (include "torbed.family" $vn) | default dict) (lower $name)) }}{{ $byVariant = false }}{{ end -}}
{{- end -}}
{{- if $byVariant -}}
{{- else if not $opt -}}
{{- $problems = append $problems (printf "%s: unknown option '%s' (tor %s has no option of that name; write names in full)" $where $name $policy.tor) -}}
{{- else if $opt.refused -}}
{{- $problems = append $problems (printf "%s: %s: %s" $where $opt.name $opt.refused) -}}
{{- else if and $rg.bandwidth (has $opt.name (list "BandwidthRate" "BandwidthBurst")) -}}
{{- $problems = append $problems (printf "%s: %s: this group's 'bandwidth' sets it; use one or the other" $where $opt.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* Exits and paths. */ -}}
{{- $exits := list -}}
{{- range $g, $rg := $relays }}{{ if $rg.exit }}{{ $exits = append $exits $g }}{{ end }}{{ end -}}
{{- if not $exits }}{{ $problems = append $problems "network.relays: no relay group has 'exit: true'; clients cannot bootstrap without exits" }}{{ end -}}
{{- range $c, $cg := $clients -}}
{{- if $cg.path -}}
{{- range $i, $hop := $cg.path -}}
{{- if not (hasKey $relays $hop) }}{{ $problems = append $problems (printf "clients.%s.path[%d]: '%s' is not a relay group (relay groups: %s)" $c $i $hop (join ", " (keys $relays | sortAlpha))) }}{{ end -}}
{{- end -}}
{{- $last := last $cg.path -}}
{{- if and (hasKey $relays $last) (not (index $relays $last).exit) -}}
{{- $problems = append $problems (printf "clients.%s.path[%d]: a path must end at an exit group; '%s' has no 'exit: true' (exit groups: %s)" $c (sub (len $cg.path) 1) $last (join ", " $exits | default "none")) -}}
{{- end -}}
{{- end -}}
{{- $wl := $cg.workload -}}
{{- $server := $wl.server -}}
{{- if not $server -}}
{{- if ne (len $servers) 1 -}}
{{- $problems = append $problems (printf "clients.%s.workload.server: required when there is more than one server group (%s)" $c (join ", " (keys $servers | sortAlpha))) -}}
{{- else -}}{{- $server = first (keys $servers) -}}{{- end -}}
{{- end -}}
{{- if $server -}}
{{- if not (hasKey $servers $server) -}}
{{- $problems = append $problems (printf "clients.%s.workload.server: '%s' is not a server group (servers: %s)" $c $server (join ", " (keys $servers | sortAlpha))) -}}
{{- else if eq $wl.kind "replay" -}}
{{- if not (index $servers $server).replay }}{{ $problems = append $problems (printf "clients.%s.workload.server: server '%s' has no replay server (add 'replay: {}' to it)" $c $server) }}{{ end -}}
{{- else if not (index $servers $server).files -}}
{{- $problems = append $problems (printf "clients.%s.workload.server: server '%s' has no files to download" $c $server) -}}
{{- else if not (hasKey ((index $servers $server).files | default dict) $wl.file) -}}
{{- $problems = append $problems (printf "clients.%s.workload.file: '%s' is not a file of server '%s' (files: %s)" $c $wl.file $server (join ", " (keys ((index $servers $server).files | default dict) | sortAlpha))) -}}
{{- end -}}
{{- end -}}
{{- if or (eq $wl.kind "fetch") (eq $wl.kind "bulk") -}}
{{- range $name := list "timeout" "stallout" -}}
{{- $d := index $wl $name -}}
{{- if and $d (le (float64 (include "torbed.seconds" $d)) 0.0) }}{{ $problems = append $problems (printf "clients.%s.workload.%s: must be longer than 0s" $c $name) }}{{ end -}}
{{- end -}}
{{- end -}}
{{- if and (eq $wl.kind "fetch") $wl.think -}}
{{- if and $wl.pause (ne (toString $wl.pause) "0s") }}{{ $problems = append $problems (printf "clients.%s.workload.think: set either 'pause' or 'think', not both" $c) }}{{ end -}}
{{- if and (eq ($wl.think.distribution | default "exponential") "uniform") (or (not $wl.think.min) (not $wl.think.max)) -}}
{{- $problems = append $problems (printf "clients.%s.workload.think: a uniform distribution needs 'min' and 'max'" $c) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- range $g, $sg := $servers -}}
{{- if not (or $sg.files $sg.replay) }}{{ $problems = append $problems (printf "servers.%s: a server needs 'files' (HTTP) or 'replay' (replay server), or both" $g) }}{{ end -}}
{{- if $sg.replay -}}
{{- $port := int ($sg.replay.port | default 8000) -}}
{{- /* Containers run as non-root: no ports below 1024; 8080 is the file server's. */ -}}
{{- if lt $port 1024 }}{{ $problems = append $problems (printf "servers.%s.replay.port: %d: on Kubernetes the replay server runs as non-root and needs a port from 1024" $g $port) }}{{ end -}}
{{- if and $sg.files (eq $port 8080) }}{{ $problems = append $problems (printf "servers.%s.replay.port: 8080 is the file server container's port in the pod; choose another" $g) }}{{ end -}}
{{- end -}}
{{- end -}}

{{- /* Inline replay traces: the Helm release and the ConfigMap are each limited to 1 MiB. */ -}}
{{- $rt := $v.replayTraces | default dict -}}
{{- $b64 := 0 -}}
{{- range $name, $data := $rt.inline | default dict }}{{ $b64 = add $b64 (len $data) }}{{ end -}}
{{- if gt $b64 699051 -}}
{{- $problems = append $problems (printf "replayTraces.inline: %d KiB of traces (base64: %d characters); at most 512 KiB fit in a Helm release: put larger ones in a ConfigMap of your own (replayTraces.configMap, at most 1 MiB) or shorten them (torbed trace slice)" (div (mul $b64 3) 4096) $b64) -}}
{{- end -}}

{{- /* Links. */ -}}
{{- $linkGroups := append (keys $seen) "authority" -}}
{{- $pairsSeen := dict -}}
{{- $linkDefault := ($v.links | default dict).default | default dict -}}
{{- range $i, $pair := ($v.links | default dict).pairs | default list -}}
{{- range $j, $g := $pair.between -}}
{{- if not (has $g $linkGroups) }}{{ $problems = append $problems (printf "links.pairs[%d].between[%d]: '%s' is not a group (groups: %s)" $i $j $g (join ", " ($linkGroups | sortAlpha))) }}{{ end -}}
{{- end -}}
{{- $key := join "|" ($pair.between | sortAlpha) -}}
{{- if hasKey $pairsSeen $key }}{{ $problems = append $problems (printf "links.pairs[%d].between: %v is listed twice" $i $pair.between) }}{{ end -}}
{{- $_ := set $pairsSeen $key true -}}
{{- if not (or $pair.rate $pair.delay $pair.jitter $pair.jitter_distribution $pair.loss $pair.loss_burst $pair.queue) -}}
{{- $problems = append $problems (printf "links.pairs[%d]: an override sets none of rate, delay, jitter, loss, queue" $i) -}}
{{- end -}}
{{- if and $pair.jitter (not $pair.delay) }}{{ $problems = append $problems (printf "links.pairs[%d].jitter: jitter needs a delay" $i) }}{{ end -}}
{{- end -}}
{{- if and $linkDefault.jitter (not $linkDefault.delay) }}{{ $problems = append $problems "links.default.jitter: jitter needs a delay" }}{{ end -}}
{{- $links := list (list "links.default" $linkDefault) -}}
{{- range $i, $pair := ($v.links | default dict).pairs | default list }}{{ $links = append $links (list (printf "links.pairs[%d]" $i) $pair) }}{{ end -}}
{{- range $i, $f := $v.faults | default list }}{{ if eq $f.kind "link" }}{{ $links = append $links (list (printf "faults[%d]" $i) $f) }}{{ end }}{{ end -}}
{{- range $x := $links -}}
{{- $where := index $x 0 -}}{{- $l := index $x 1 -}}
{{- if and $l.jitter $l.delay (gt (float64 (include "torbed.seconds" $l.jitter)) (float64 (include "torbed.seconds" $l.delay))) -}}
{{- $problems = append $problems (printf "%s.jitter: jitter larger than the delay would reorder packets" $where) -}}
{{- end -}}
{{- if and $l.rate (lt (int64 (include "torbed.bits" $l.rate)) 8000) -}}
{{- $problems = append $problems (printf "%s.rate: %s is below 8kbit; tor cannot work that slowly" $where $l.rate) -}}
{{- end -}}
{{- end -}}

{{- /* Measurement. */ -}}
{{- $m := $v.measure | default dict -}}
{{- $duration := float64 (include "torbed.seconds" ($m.duration | default "5m")) -}}
{{- $warmup := float64 (include "torbed.seconds" ($m.warmup | default "30s")) -}}
{{- if le $duration 0.0 }}{{ $problems = append $problems "measure.duration: must be longer than 0s" }}{{ end -}}
{{- if lt (float64 (include "torbed.seconds" ($m.bw_interval | default "500ms"))) 0.1 }}{{ $problems = append $problems "measure.bw_interval: must be at least 100ms" }}{{ end -}}
{{- if ge $warmup $duration }}{{ $problems = append $problems (printf "measure.warmup: warmup %s is not shorter than duration %s" ($m.warmup | default "30s") ($m.duration | default "5m")) }}{{ end -}}

{{- /* Placement and faults name groups (faults may also name nodes like 'middle0'). */ -}}
{{- range $g, $_ := $v.placement | default dict -}}
{{- if not (has $g $linkGroups) }}{{ $problems = append $problems (printf "placement.%s: '%s' is not a group (groups: %s)" $g $g (join ", " ($linkGroups | sortAlpha))) }}{{ end -}}
{{- end -}}
{{- /* Every group's node count: a link fault may name any group or node ('authority' is the group auth). */ -}}
{{- $counts := dict "auth" (int (include "torbed.authorityCount" .)) -}}
{{- range $g, $x := $relays }}{{ $_ := set $counts $g (int ($x.count | default 1)) }}{{ end -}}
{{- range $g, $x := $servers }}{{ $_ := set $counts $g (int ($x.count | default 1)) }}{{ end -}}
{{- range $g, $x := $clients }}{{ $_ := set $counts $g (int ($x.count | default 1)) }}{{ end -}}
{{- if include "torbed.load" . }}{{ $_ := set $counts "load" (int (include "torbed.loadWorkers" .)) }}{{ $_ := set $counts "locust" 1 }}{{ end -}}
{{- range $i, $f := $v.faults | default list -}}
{{- if eq $f.kind "link" -}}
{{- $sides := dict -}}
{{- if $f.target }}{{ $_ := set $sides "target" $f.target }}{{ end -}}
{{- range $j, $x := $f.between | default list }}{{ $_ := set $sides (printf "between[%d]" $j) $x }}{{ end -}}
{{- if eq (len ($f.between | default list)) 2 -}}
{{- $a := ternary "auth" (index $f.between 0) (eq (index $f.between 0) "authority") -}}
{{- $b := ternary "auth" (index $f.between 1) (eq (index $f.between 1) "authority") -}}
{{- if or (eq $a $b) (and (hasKey $counts $a) (eq (regexReplaceAll "[0-9]+$" $b "") $a)) (and (hasKey $counts $b) (eq (regexReplaceAll "[0-9]+$" $a "") $b)) -}}
{{- $problems = append $problems (printf "faults[%d].between: %v: the two sides share node(s)" $i $f.between) -}}
{{- end -}}
{{- end -}}
{{- range $field, $name := $sides -}}
{{- $n := ternary "auth" $name (eq $name "authority") -}}
{{- $base := regexReplaceAll "[0-9]+$" $n "" -}}
{{- if hasKey $counts $n -}}
{{- else if and (ne $base $n) (hasKey $counts $base) -}}
{{- if ge (atoi (trimPrefix $base $n)) (int (index $counts $base)) }}{{ $problems = append $problems (printf "faults[%d].%s: '%s': group '%s' has %d node(s)" $i $field $name $base (int (index $counts $base))) }}{{ end -}}
{{- else -}}
{{- $problems = append $problems (printf "faults[%d].%s: '%s' is not a group or node (groups: %s; nodes are <group><index>, e.g. middle0)" $i $field $name (join ", " (keys $counts | sortAlpha))) -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- $base := regexReplaceAll "[0-9]+$" $f.target "" -}}
{{- if and (not (hasKey $relays $f.target)) (not (hasKey $relays $base)) -}}
{{- $problems = append $problems (printf "faults[%d].target: '%s' is not a relay group or relay node (relay groups: %s; nodes are <group><index>, e.g. middle0)" $i $f.target (join ", " (keys $relays | sortAlpha))) -}}
{{- else if not (hasKey $relays $f.target) -}}
{{- $count := (index $relays $base).count | default 1 -}}
{{- if ge (atoi (trimPrefix $base $f.target)) (int $count) }}{{ $problems = append $problems (printf "faults[%d].target: '%s': group '%s' has %d node(s)" $i $f.target $base (int $count)) }}{{ end -}}
{{- end -}}
{{- end -}}
{{- if and (eq $f.kind "cpu") $f.cpu (lt (float64 (regexReplaceAll "\\s*%$" (toString $f.cpu) "")) 1.0) -}}
{{- $problems = append $problems (printf "faults[%d].cpu: %s is below 1%% of a core (the kernel's smallest useful quota)" $i $f.cpu) -}}
{{- end -}}
{{- if ge (float64 (include "torbed.seconds" $f.at)) $duration }}{{ $problems = append $problems (printf "faults[%d].at: %s is after the end of the workload (%s)" $i $f.at ($m.duration | default "5m")) }}{{ end -}}
{{- end -}}

{{- /* Sequential design (torbed.scenario _design_problems). */ -}}
{{- with $v.design -}}
{{- $d := . -}}
{{- if gt (int $d.pilot) (int $d.max_repetitions) }}{{ $problems = append $problems (printf "design.pilot: %d is more than design.max_repetitions (%d)" (int $d.pilot) (int $d.max_repetitions)) }}{{ end -}}
{{- if and (hasKey $v "repetitions") (ne (int $v.repetitions) (int $d.max_repetitions)) }}{{ $problems = append $problems (printf "repetitions: %d, but design.max_repetitions is %d: with a design, repetitions is the maximum (leave it out or make them equal)" (int $v.repetitions) (int $d.max_repetitions)) }}{{ end -}}
{{- if lt (len ($v.variants | default list)) 2 }}{{ $problems = append $problems "design: a sequential design compares variants: the scenario needs at least two" }}{{ end -}}
{{- $sw := $d.stop_when | default dict -}}
{{- $base := $v.baseline | default (first ($v.variants | default (list ""))) -}}
{{- if and $sw.variant (or (not (has $sw.variant ($v.variants | default list))) (eq $sw.variant $base)) }}{{ $problems = append $problems (printf "design.stop_when.variant: '%s' must be one of variants other than the baseline '%s'" $sw.variant $base) }}{{ end -}}
{{- $metric := $sw.metric | default "" -}}
{{- if and (contains "/" $metric) (contains ":" $metric) -}}
{{- $gf := splitn ":" 2 (index (splitn "/" 2 $metric) "_1") -}}
{{- $cg := index $clients $gf._0 -}}
{{- if not $cg }}{{ $problems = append $problems (printf "design.stop_when.metric: '%s' is not a client group (%s)" $gf._0 (join ", " (keys $clients | sortAlpha))) }}
{{- else if ne ((($cg.workload | default dict).file) | default "") $gf._1 }}{{ $problems = append $problems (printf "design.stop_when.metric: client group '%s' fetches '%s', not '%s'" $gf._0 ((($cg.workload | default dict).file) | default "") $gf._1) }}{{ end -}}
{{- else if or (hasPrefix "relay_throughput_Bps/" $metric) (hasPrefix "cell_wait_ms/" $metric) -}}
{{- $relay := index (splitList "/" $metric) 1 -}}
{{- if not (hasKey $relays (regexReplaceAll "[0-9]+$" $relay "")) }}{{ $problems = append $problems (printf "design.stop_when.metric: '%s' is not a relay of network.relays" $relay) }}{{ end -}}
{{- end -}}
{{- end -}}

{{- if $problems -}}
{{- fail (printf "\nscenario %s is not valid:\n  %s" ($v.name | default "?") (join "\n  " $problems)) -}}
{{- end -}}
{{- end -}}
