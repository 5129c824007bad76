// placeholder so the module library has a source until its code lands
namespace g4 { [[maybe_unused]] static int model_module_anchor = 0; }
