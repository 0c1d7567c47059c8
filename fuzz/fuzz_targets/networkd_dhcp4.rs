//! What the DHCPv4 client does with a received datagram
//! (`networkd::dhcp::packet::fuzz_reply`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = networkd::dhcp::packet::fuzz_reply(data);
});
