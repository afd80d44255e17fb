//! Real SYN cookies for the kernel tests: TCP handshakes completed over a
//! veth pair between two namespaces the test creates, the server's side
//! sending a cookie in every SYN-ACK (`net.ipv4.tcp_syncookies = 2`), and
//! each client's last ACK of its handshake captured as it left the client
//! (an `AF_PACKET` socket on the client's end). The kernel's cookie secret
//! is the whole machine's, so the captured frame carries a cookie that the
//! XDP program's `bpf_tcp_raw_check_syncookie_*` accepts when it is run
//! through BPF_PROG_TEST_RUN, as it would on the wire.

use std::{
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener},
    os::fd::{AsRawFd, OwnedFd},
    time::{Duration, Instant},
};

use nix::sys::{
    socket::{
        bind, connect, recv, setsockopt, socket, sockopt, AddressFamily, MsgFlags, SockFlag,
        SockProtocol, SockType, SockaddrStorage,
    },
    time::TimeVal,
};

use crate::netns::{NetNs, Veth};

/// The server's addresses.
pub const SERVER4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
pub const SERVER6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xc, 0, 0, 0, 0, 1);
/// The server's port.
pub const PORT: u16 = 8080;
/// How long a handshake's ACK may take to show up.
const CAPTURE: Duration = Duration::from_secs(5);

/// A client namespace and a server namespace joined by a veth pair, the
/// server listening with SYN cookies for every connection.
pub struct Handshakes {
    client: NetNs,
    _server: NetNs,
    _listeners: Vec<TcpListener>,
}

impl Handshakes {
    pub fn new() -> Self {
        let client = NetNs::new("ckc");
        let server = NetNs::new("cks");
        Veth::connect(&client, "veth-c", &server, "veth-s");
        server.ip(&["addr", "add", &format!("{SERVER4}/24"), "dev", "veth-s"]);
        server.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{SERVER6}/64"),
            "dev",
            "veth-s",
            "nodad",
        ]);
        // Clients of any IPv6 /48 of the documentation prefix: the
        // server's /64 on-link from the client, theirs from the server.
        client.ip(&[
            "-6",
            "route",
            "add",
            &format!("{SERVER6}/128"),
            "dev",
            "veth-c",
        ]);
        server.ip(&["-6", "route", "add", "2001:db8::/32", "dev", "veth-s"]);
        server
            .enter(|| fs::write("/proc/sys/net/ipv4/tcp_syncookies", "2"))
            .expect("cookies for every SYN in the server's namespace");
        let listeners = server.enter(|| {
            [IpAddr::V4(SERVER4), IpAddr::V6(SERVER6)]
                .map(|ip| TcpListener::bind(SocketAddr::new(ip, PORT)).expect("listen"))
                .into_iter()
                .collect()
        });
        Self {
            client,
            _server: server,
            _listeners: listeners,
        }
    }

    /// The Ethernet frame of the last ACK of a handshake from `source`
    /// (an address the client takes on) to the server, as it left the
    /// client: its acknowledgement number is the server's cookie plus one.
    pub fn last_ack(&self, source: IpAddr) -> Vec<u8> {
        let (server, prefix, family) = match source {
            IpAddr::V4(_) => (IpAddr::V4(SERVER4), 24, vec![]),
            IpAddr::V6(_) => (IpAddr::V6(SERVER6), 64, vec!["-6"]),
        };
        let mut args = family.clone();
        let addr = format!("{source}/{prefix}");
        args.extend(["addr", "add", &addr, "dev", "veth-c"]);
        if source.is_ipv6() {
            args.push("nodad");
        }
        self.client.ip(&args);
        self.client.enter(|| {
            let capture = socket(
                AddressFamily::Packet,
                SockType::Raw,
                SockFlag::empty(),
                SockProtocol::EthAll,
            )
            .expect("a packet socket");
            setsockopt(&capture, sockopt::ReceiveTimeout, &TimeVal::new(0, 200_000))
                .expect("a receive timeout");
            let _connected = handshake(source, server);
            let started = Instant::now();
            let mut frame = vec![0u8; 2048];
            while started.elapsed() < CAPTURE {
                let Ok(len) = recv(capture.as_raw_fd(), &mut frame, MsgFlags::empty()) else {
                    continue;
                };
                if is_last_ack(&frame[..len], source) {
                    return frame[..len].to_vec();
                }
            }
            panic!("no handshake's last ACK from {source} seen in {CAPTURE:?}");
        })
    }
}

impl Default for Handshakes {
    fn default() -> Self {
        Self::new()
    }
}

/// A TCP connection from `source` to `server`:`PORT`, completed.
fn handshake(source: IpAddr, server: IpAddr) -> OwnedFd {
    let family = if source.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket(family, SockType::Stream, SockFlag::empty(), None).expect("a TCP socket");
    bind(
        fd.as_raw_fd(),
        &SockaddrStorage::from(SocketAddr::new(source, 0)),
    )
    .expect("bind the client's address");
    connect(
        fd.as_raw_fd(),
        &SockaddrStorage::from(SocketAddr::new(server, PORT)),
    )
    .expect("connect to the server");
    fd
}

/// Whether `frame` is a TCP segment from `source` to the server's port
/// with ACK alone set and no payload.
fn is_last_ack(frame: &[u8], source: IpAddr) -> bool {
    let Ok(packet) = etherparse::SlicedPacket::from_ethernet(frame) else {
        return false;
    };
    let from = match &packet.net {
        Some(etherparse::NetSlice::Ipv4(ip)) => IpAddr::V4(ip.header().source_addr()),
        Some(etherparse::NetSlice::Ipv6(ip)) => IpAddr::V6(ip.header().source_addr()),
        _ => return false,
    };
    let Some(etherparse::TransportSlice::Tcp(tcp)) = &packet.transport else {
        return false;
    };
    from == source
        && tcp.destination_port() == PORT
        && tcp.ack()
        && !tcp.syn()
        && !tcp.fin()
        && !tcp.rst()
        && !tcp.psh()
        && tcp.payload().is_empty()
}
