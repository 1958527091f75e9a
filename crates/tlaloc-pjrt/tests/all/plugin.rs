//! Loading, attributes, clients, devices.

use tlaloc_pjrt::{AttributeValue, Plugin};

use crate::common::on_each_plugin;

#[test]
fn smoke_attributes_and_devices() {
    on_each_plugin(|path, client| {
        let plugin = Plugin::load(path).unwrap();
        eprintln!("version {:?}", plugin.api_version());
        for (name, value) in plugin.attributes().unwrap() {
            eprintln!("  {name} = {value:?}");
        }
        let _ = AttributeValue::Bool(true);
        eprintln!(
            "platform {} {}",
            client.platform_name().unwrap(),
            client.platform_version().unwrap()
        );
        for device in client.addressable_devices().unwrap() {
            eprintln!(
                "  device {} {} {:?}",
                device.id(),
                device.kind(),
                device.memory_stats()
            );
        }
    });
}
