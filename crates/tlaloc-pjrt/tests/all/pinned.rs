//! Host memory mapped for DMA: where the plugin maps it, bytes uploaded from it reach the device
//! unchanged; where it does not (the CPU plugins), the binding says so with `None`, not an error.

use tlaloc_pjrt::{ElementType, Error};

use crate::common::{on_each_plugin, values};

#[test]
fn pinned_memory_uploads_what_was_written_or_is_declined() {
    on_each_plugin(|path, client| {
        let device = client.addressable_devices().unwrap().remove(0);
        // Not a whole number of pages, so the rounding is exercised.
        let n = 3000;
        let Some(mut pinned) = client.pinned_host_memory(n * 4).unwrap() else {
            eprintln!("{} maps no host memory", path.display());
            return;
        };
        assert!(pinned.len() >= n * 4 && pinned.len() % 4096 == 0);
        assert!(
            pinned.iter().all(|&b| b == 0),
            "fresh pinned memory is zero"
        );
        let expected = values(7, n);
        pinned[..n * 4].copy_from_slice(bytemuck::cast_slice(&expected));
        let buffer = client
            .buffer_from_host_bytes(&pinned[..n * 4], ElementType::F32, &[n as i64], &device)
            .unwrap();
        // Overwritten after the upload returned: the device copy must not change.
        pinned.fill(0xff);
        assert_eq!(buffer.to_host_vec::<f32>().unwrap(), expected);
    });
}

#[test]
fn zero_bytes_of_pinned_memory_are_refused() {
    on_each_plugin(|_, client| {
        let error = client.pinned_host_memory(0).unwrap_err();
        assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
        assert!(error.to_string().contains("0 bytes"), "{error}");
    });
}
