//! stated's request handling: Get, List, Create, Update, Destroy, Watch and Teardown requests
//! as decoded protobuf, from admin, daemons and strangers (`stated::testing::fuzz_requests`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = stated::testing::fuzz_requests(data);
});
