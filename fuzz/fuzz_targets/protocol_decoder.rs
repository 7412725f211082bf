//! Fuzzes the executor's message decoder: any bytes are decoded as a request, a response
//! and a hello; re-encoding what decodes must decode to the same value.
#![no_main]

use kiln_remote::protocol::{Hello, Request, Response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = Request::decode(data) {
        let frame = request.encode();
        assert_eq!(Request::decode(&frame[4..]).as_ref(), Ok(&request));
    }
    if let Ok(response) = Response::decode(data) {
        let frame = response.encode();
        assert_eq!(Response::decode(&frame[4..]).as_ref(), Ok(&response));
    }
    let _ = Hello::decode(data);
});
