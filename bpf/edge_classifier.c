// SPDX-License-Identifier: GPL-2.0
/*
 * edgetune: put inference traffic into the high-priority HTB class.
 *
 * A TC classifier (BPF_PROG_TYPE_SCHED_CLS, direct-action) for the clsact
 * egress hook. It runs before the packet is enqueued on the root qdisc and
 * sets skb->priority to the classid of the HTB leaf the packet belongs to;
 * htb_classify() (net/sched/sch_htb.c) takes a valid leaf classid from
 * skb->priority without consulting any HTB filter. A packet matches when
 *   - its TCP or UDP destination or source port is a key of edge_ports
 *     (the value is the classid to set), or
 *   - (EDGE_MATCH_CGROUP builds only) its socket belongs to the cgroup v2
 *     edge_config.cgroup_id or to a cgroup below it.
 * Other packets are left alone (their skb->priority, e.g. from SO_PRIORITY,
 * is kept) and end up in the HTB default class. The program never drops or
 * redirects: it returns TC_ACT_UNSPEC so that later clsact filters still run.
 *
 * Compiled and loaded by bcc (plugins/module_utils/device/edge_netqos_loader.py); see bpf/README.md.
 * Build-time knobs (-D...): EDGE_L2_LEN (14 for Ethernet, 0 for L3 devices
 * such as WireGuard), EDGE_MAX_PORTS, EDGE_MATCH_CGROUP (0 or 1; 1 needs
 * CONFIG_SOCK_CGROUP_DATA, and the helper works on egress only).
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/pkt_cls.h>

#ifndef EDGE_L2_LEN
#define EDGE_L2_LEN ETH_HLEN
#endif
#ifndef EDGE_MAX_PORTS
#define EDGE_MAX_PORTS 16
#endif
#ifndef EDGE_MATCH_CGROUP
#define EDGE_MATCH_CGROUP 0
#endif
/* IPv6 extension headers skipped before giving up on finding the ports. */
#define EDGE_IPV6_EXT_MAX 4

struct edge_cfg {
	__u64 cgroup_id;	/* cgroup v2 id (its kernfs inode); 0 = off */
	__u32 cgroup_level;	/* depth of that cgroup below the v2 root */
	__u32 cgroup_classid;	/* skb->priority for its packets */
};

/* Port in network byte order -> classid (TC_H_MAKE(major << 16, minor)). */
BPF_HASH(edge_ports, __be16, __u32, EDGE_MAX_PORTS);
BPF_ARRAY(edge_config, struct edge_cfg, 1);

/* Look the L4 ports up; l4 points at a TCP or UDP header (both start with
 * the 16-bit source and destination ports). */
static __always_inline int edge_mark_ports(struct __sk_buff *skb, void *l4,
					   void *data_end)
{
	__be16 *ports = l4;
	__be16 port;
	__u32 *classid;

	if ((void *)(ports + 2) > data_end)
		return 0;
	port = ports[1];			/* destination */
	classid = edge_ports.lookup(&port);
	if (!classid) {
		port = ports[0];		/* source */
		classid = edge_ports.lookup(&port);
	}
	if (!classid)
		return 0;
	skb->priority = *classid;
	return 1;
}

int edge_classify(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	void *l3 = data + EDGE_L2_LEN;
	void *l4;
	__u8 proto;

#if EDGE_MATCH_CGROUP
	{
		__u32 zero = 0;
		struct edge_cfg *cfg = edge_config.lookup(&zero);

		/* 0 when the skb has no full socket (forwarded traffic). */
		if (cfg && cfg->cgroup_id &&
		    bpf_skb_ancestor_cgroup_id(skb, cfg->cgroup_level) == cfg->cgroup_id) {
			skb->priority = cfg->cgroup_classid;
			return TC_ACT_UNSPEC;
		}
	}
#endif

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = l3;
		__u32 ihl;

		if ((void *)(ip + 1) > data_end)
			return TC_ACT_UNSPEC;
		/* Only the first fragment carries the ports. */
		if (ip->frag_off & bpf_htons(0x1fff))
			return TC_ACT_UNSPEC;
		ihl = ip->ihl * 4;
		if (ihl < sizeof(*ip))
			return TC_ACT_UNSPEC;
		proto = ip->protocol;
		l4 = l3 + ihl;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = l3;
		int i;

		if ((void *)(ip6 + 1) > data_end)
			return TC_ACT_UNSPEC;
		proto = ip6->nexthdr;
		l4 = (void *)(ip6 + 1);
		/* Skip hop-by-hop, routing, fragment and destination options
		 * headers; a non-first fragment carries no ports. */
#pragma unroll
		for (i = 0; i < EDGE_IPV6_EXT_MAX; i++) {
			__u8 *ext = l4;

			if (proto != IPPROTO_HOPOPTS && proto != IPPROTO_ROUTING &&
			    proto != IPPROTO_DSTOPTS && proto != IPPROTO_FRAGMENT)
				break;
			if ((void *)(ext + 8) > data_end)
				return TC_ACT_UNSPEC;
			if (proto == IPPROTO_FRAGMENT) {
				/* frag_off (13 bits, in 8-byte units) + 2 flags */
				if (((ext[2] << 8) | ext[3]) & 0xfff8)
					return TC_ACT_UNSPEC;
				proto = ext[0];
				l4 = ext + 8;
			} else {
				proto = ext[0];
				l4 = ext + ((ext[1] + 1) << 3);
			}
		}
	} else {
		return TC_ACT_UNSPEC;
	}

	if (proto == IPPROTO_TCP || proto == IPPROTO_UDP)
		edge_mark_ports(skb, l4, data_end);
	return TC_ACT_UNSPEC;
}
