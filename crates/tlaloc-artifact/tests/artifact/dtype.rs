//! Dtype names and byte sizes.

use std::str::FromStr;

use tlaloc_artifact::Dtype;

#[test]
fn names_round_trip_through_json_and_from_str() {
    for dtype in Dtype::ALL {
        let json = serde_json::to_string(&dtype).expect("serialize");
        assert_eq!(json, format!("\"{}\"", dtype.name()));
        assert_eq!(serde_json::from_str::<Dtype>(&json).expect("parse"), dtype);
        assert_eq!(Dtype::from_str(dtype.name()), Ok(dtype));
    }
    let err = Dtype::from_str("f64").unwrap_err();
    assert!(err.to_string().contains("\"f64\""), "{err}");
}

#[test]
fn byte_sizes_match_the_rust_types() {
    let sizes = [
        (Dtype::F32, size_of::<f32>()),
        (Dtype::Bf16, size_of::<u16>()),
        (Dtype::F16, size_of::<u16>()),
        (Dtype::I32, size_of::<i32>()),
        (Dtype::I8, size_of::<i8>()),
        (Dtype::U8, size_of::<u8>()),
        (Dtype::F8E4M3FN, size_of::<u8>()),
    ];
    for (dtype, size) in sizes {
        assert_eq!(dtype.byte_size(), size, "{dtype}");
    }
    assert_eq!(Dtype::Bf16.byte_length(&[3, 5]), Some(30));
    assert_eq!(Dtype::F32.byte_length(&[usize::MAX, 2]), None);
}
