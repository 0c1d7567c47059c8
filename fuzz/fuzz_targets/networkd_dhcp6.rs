//! What the DHCPv6 client does with a received datagram
//! (`networkd::dhcp6::packet::fuzz_reply`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = networkd::dhcp6::packet::fuzz_reply(data);
});
