// SPDX-License-Identifier: Apache-2.0
#pragma once

// The order-free policy list.
//
// A component that is configured by policies (the trainer is the main one) names one default
// policy per family it accepts. The user passes policies in any order; each one says its family
// with a tag:
//
//     struct my_batch { using policy_category = strata::batch_policy_tag; ... };
//
// `policy_set<type_list<Defaults...>, Policies...>` then
//   1. rejects a type that has no `policy_category` member,
//   2. rejects a policy whose family the component does not accept,
//   3. rejects two policies of one family,
// each with a one-line ASCII static_assert (the offending type or family appears in the
// compiler's "required from" line), and
//   4. answers `get<Tag>`: the user's policy of that family, or the default.
//
// Structural checks of each family (does this comm backend have `rank()`?) belong to the family's
// `concepts.hpp` and are asserted where the policies meet (train/).

#include <cstddef>
#include <string_view>
#include <type_traits>

namespace strata {

// Family tags. A policy opts into a family with `using policy_category = <tag>;`.
struct batch_policy_tag {
  static constexpr std::string_view family_name = "BatchPolicy";
};
struct precision_policy_tag {
  static constexpr std::string_view family_name = "PrecisionPolicy";
};
struct parallel_policy_tag {
  static constexpr std::string_view family_name = "ParallelPolicy";
};
struct loss_tag {
  static constexpr std::string_view family_name = "Loss";
};
struct comm_backend_tag {
  static constexpr std::string_view family_name = "CommBackend";
};
struct pipeline_schedule_tag {
  static constexpr std::string_view family_name = "PipelineSchedule";
};

template <class... Ts>
struct type_list {
  static constexpr std::size_t size = sizeof...(Ts);
};

// A type is a policy when it names its family.
template <class T>
concept policy = requires {
  typename T::policy_category;
};

template <class T>
using policy_category_t = typename T::policy_category;

// A policy of family Tag.
template <class T, class Tag>
concept policy_of = policy<T> && std::is_same_v<policy_category_t<T>, Tag>;

namespace detail {

// The category of T, or `no_family` when T has none (so later checks stay quiet after the first
// error instead of adding a cascade of unrelated ones).
struct no_family {};

template <class T>
struct category_or_none {
  using type = no_family;
};
template <policy T>
struct category_or_none<T> {
  using type = policy_category_t<T>;
};
template <class T>
using category_or_none_t = typename category_or_none<T>::type;

template <class Tag, class... Ts>
inline constexpr std::size_t count_of_family =
    (std::size_t{0} + ... +
     (std::is_same_v<category_or_none_t<Ts>, Tag> ? std::size_t{1} : std::size_t{0}));

template <class T>
struct check_is_policy {
  static_assert(policy<T>,
                "strata policy list: this type is not a policy: it has no 'policy_category' "
                "member naming its family (see the type in the 'required from' line)");
  static constexpr bool value = policy<T>;
};

template <class T, class Defaults>
struct check_known_family;
template <class T, class... Defaults>
struct check_known_family<T, type_list<Defaults...>> {
  static constexpr bool value =
      !policy<T> || (std::is_same_v<category_or_none_t<T>, policy_category_t<Defaults>> || ...);
  static_assert(value,
                "strata policy list: this policy's family is not accepted here: its "
                "'policy_category' names none of the families this component takes");
};

template <class Tag, std::size_t Count>
struct check_one_per_family {
  static_assert(Count <= 1,
                "strata policy list: two policies of one family were given; pass at most one "
                "policy per family (the family tag is in the 'required from' line)");
  static constexpr bool value = Count <= 1;
};

// The first of Ts whose category is Tag, else Default.
template <class Tag, class Default, class... Ts>
struct find_policy {
  using type = Default;
};
template <class Tag, class Default, class T, class... Ts>
struct find_policy<Tag, Default, T, Ts...> {
  using type = std::conditional_t<std::is_same_v<category_or_none_t<T>, Tag>, T,
                                  typename find_policy<Tag, Default, Ts...>::type>;
};

template <class Tag, class... Defaults>
struct default_for {
  using type = no_family;
};
template <class Tag, class D, class... Defaults>
struct default_for<Tag, D, Defaults...> {
  using type = std::conditional_t<std::is_same_v<policy_category_t<D>, Tag>, D,
                                  typename default_for<Tag, Defaults...>::type>;
};

// `Valid` is the list's verdict; naming it here makes every lookup run the list's checks.
template <bool Valid, class Tag, class Default, class... Ts>
struct lookup_policy {
  static_assert(!std::is_same_v<Default, no_family>,
                "strata policy list: get<Tag> names a family this component does not take");
  using type = typename find_policy<Tag, Default, Ts...>::type;
};

}  // namespace detail

template <class Defaults, class... Policies>
struct policy_set;

// Defaults: one policy per accepted family. Policies: the user's, in any order.
template <class... Defaults, class... Policies>
struct policy_set<type_list<Defaults...>, Policies...> {
  static_assert((policy<Defaults> && ...),
                "strata policy list: every default must be a policy with a 'policy_category'");
  static_assert(((detail::count_of_family<policy_category_t<Defaults>, Defaults...> == 1) && ...),
                "strata policy list: the defaults must name each family exactly once");

  static constexpr bool all_policies = (detail::check_is_policy<Policies>::value && ...);
  static constexpr bool all_known =
      (detail::check_known_family<Policies, type_list<Defaults...>>::value && ...);
  static constexpr bool one_per_family =
      (detail::check_one_per_family<
           policy_category_t<Defaults>,
           detail::count_of_family<policy_category_t<Defaults>, Policies...>>::value &&
       ...);
  // True when the list is valid; the static_asserts above have already said why when it is not.
  static constexpr bool valid = all_policies && all_known && one_per_family;

  // The policy of family Tag: the user's when given, else the default.
  template <class Tag>
  using get = typename detail::lookup_policy<
      valid, Tag, typename detail::default_for<Tag, Defaults...>::type, Policies...>::type;

  // Whether the user gave a policy of family Tag (rather than taking the default).
  template <class Tag>
  static constexpr bool given = detail::count_of_family<Tag, Policies...> != 0;

  using defaults = type_list<Defaults...>;
  using policies = type_list<Policies...>;
};

}  // namespace strata
