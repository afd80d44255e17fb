//! An interface's XDP program through rtnetlink, as libxdp drives it:
//! which program is attached and in which mode (`IFLA_XDP_PROG_ID`,
//! `IFLA_XDP_ATTACHED`), and attaching one by file descriptor
//! (`IFLA_XDP_FD`), in place of an expected one (`XDP_FLAGS_REPLACE` with
//! `IFLA_XDP_EXPECTED_FD`) or only where there is none
//! (`XDP_FLAGS_UPDATE_IF_NOEXIST`). A dispatcher is attached this way, not
//! by a bpf_link, so that every libxdp user can replace it.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_REQUEST,
};
use netlink_packet_route::{
    link::{LinkAttribute, LinkMessage, LinkXdp, XdpAttached},
    RouteNetlinkMessage,
};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// Attach only where no program is (`XDP_FLAGS_UPDATE_IF_NOEXIST`).
pub const UPDATE_IF_NOEXIST: u32 = 1 << 0;
/// Generic (skb) mode (`XDP_FLAGS_SKB_MODE`).
pub const SKB_MODE: u32 = 1 << 1;
/// Native (driver) mode (`XDP_FLAGS_DRV_MODE`).
pub const DRV_MODE: u32 = 1 << 2;
/// Replace the program `IFLA_XDP_EXPECTED_FD` names (`XDP_FLAGS_REPLACE`).
pub const REPLACE: u32 = 1 << 4;

/// The program attached to an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attached {
    pub prog_id: u32,
    /// Generic (skb) mode rather than native.
    pub generic: bool,
}

/// The XDP program attached to interface `ifindex`, if any.
pub fn attached(ifindex: u32) -> io::Result<Option<Attached>> {
    let mut message = LinkMessage::default();
    message.header.index = ifindex;
    let replies = request(RouteNetlinkMessage::GetLink(message), NLM_F_REQUEST)?;
    let mut found = None;
    for reply in replies {
        let RouteNetlinkMessage::NewLink(link) = reply else {
            continue;
        };
        for attribute in link.attributes {
            let LinkAttribute::Xdp(xdp) = attribute else {
                continue;
            };
            let mut prog_id = 0;
            let mut generic = false;
            for field in xdp {
                match field {
                    LinkXdp::ProgId(id) => prog_id = id,
                    LinkXdp::Attached(XdpAttached::SocketBuffer) => generic = true,
                    _ => {}
                }
            }
            if prog_id != 0 {
                found = Some(Attached { prog_id, generic });
            }
        }
    }
    Ok(found)
}

/// Attaches `program` (`None`: detaches) to interface `ifindex` with
/// `flags`, replacing `expected` when given.
pub fn set(
    ifindex: u32,
    program: Option<BorrowedFd<'_>>,
    flags: u32,
    expected: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut xdp = vec![
        LinkXdp::Fd(program.map_or(-1, |fd| fd.as_raw_fd())),
        LinkXdp::Flags(flags | expected.map_or(0, |_| REPLACE)),
    ];
    if let Some(expected) = expected {
        xdp.push(LinkXdp::ExpectedFd(expected.as_raw_fd() as u32));
    }
    let mut message = LinkMessage::default();
    message.header.index = ifindex;
    message.attributes.push(LinkAttribute::Xdp(xdp));
    request(
        RouteNetlinkMessage::SetLink(message),
        NLM_F_REQUEST | NLM_F_ACK,
    )
    .map(drop)
}

/// Sends one request and reads its replies up to the acknowledgement (or
/// the one answer of a `GetLink`); an error reply becomes its errno.
fn request(payload: RouteNetlinkMessage, flags: u16) -> io::Result<Vec<RouteNetlinkMessage>> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut packet = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::from(payload));
    packet.header.flags = flags;
    packet.header.sequence_number = 1;
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    socket.send(&buf, 0)?;
    let wants_ack = flags & NLM_F_ACK != 0;
    let mut replies = Vec::new();
    let mut receive = vec![0u8; 64 * 1024];
    loop {
        let size = socket.recv(&mut &mut receive[..], 0)?;
        let mut offset = 0;
        while offset < size {
            let reply: NetlinkMessage<RouteNetlinkMessage> =
                NetlinkMessage::deserialize(&receive[offset..size])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let length = reply.header.length as usize;
            match reply.payload {
                NetlinkPayload::Error(error) => {
                    return match error.code {
                        Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                        None => Ok(replies),
                    };
                }
                NetlinkPayload::Done(_) => return Ok(replies),
                NetlinkPayload::InnerMessage(message) => {
                    replies.push(message);
                    if !wants_ack {
                        return Ok(replies);
                    }
                }
                _ => {}
            }
            if length == 0 {
                break;
            }
            offset += length;
        }
    }
}
