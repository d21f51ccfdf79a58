//! Every request body type decoded from arbitrary bytes: must return Ok or Err, never panic,
//! and what decodes must encode and decode again to the same value.
#![no_main]

use ferry_shared::api::{
    BatchRequest, CacheCommand, ExecuteRequest, KeyedRequest, QueryRequest,
};
use libfuzzer_sys::fuzz_target;

fn round_trip<T>(data: &[u8])
where
    T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
{
    if let Ok(v) = serde_json::from_slice::<T>(data) {
        let again = serde_json::to_vec(&v).expect("what decoded encodes");
        let back: T = serde_json::from_slice(&again).expect("what encoded decodes");
        assert_eq!(v, back);
    }
}

fuzz_target!(|data: &[u8]| {
    round_trip::<QueryRequest>(data);
    round_trip::<ExecuteRequest>(data);
    round_trip::<CacheCommand>(data);
    round_trip::<BatchRequest>(data);
    round_trip::<KeyedRequest>(data);
});
